"""`toolops run`: the embedded executor (no broker), until idle or for a time."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from toolops.cli.base import Output, print_json

NAME = "run"
HELP = "the embedded executor"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--until-idle", action="store_true")
    parser.add_argument("--max-seconds", type=float, default=None)


def run(*, opts: dict[str, Any], out: Output, err: Output) -> int | None:
    from toolops.runner import run_embedded

    stats = run_embedded(until_idle=opts["until_idle"], max_seconds=opts["max_seconds"])
    print_json(out, {"polls": stats.polls, "outcomes": stats.outcomes})
    return None
