"""`toolops demo`: the README's main job against the reference server (toolops/demo.py)."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from toolops.cli.base import Output

NAME = "demo"
HELP = "the README's main job against the reference server"


def add_arguments(parser: ArgumentParser) -> None:
    return None


def run(*, opts: dict[str, Any], out: Output, err: Output) -> int | None:
    from toolops.demo import run_demo

    return run_demo(out=out)
