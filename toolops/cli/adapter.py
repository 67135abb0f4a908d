"""`toolops adapter`: list adapter versions; drain, enable or disable one."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from toolops.cli.base import Output, print_json

NAME = "adapter"
HELP = "list adapter versions; drain, enable or disable one"


def add_arguments(parser: ArgumentParser) -> None:
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--list", action="store_true")
    action.add_argument("--drain", metavar="VERSION")
    action.add_argument("--enable", metavar="VERSION")
    action.add_argument("--disable", metavar="VERSION")
    parser.add_argument("--reason", default="")


def run(*, opts: dict[str, Any], out: Output, err: Output) -> int | None:
    from toolops.services.adapters_admin import adapter_list, adapter_set_status

    if opts["list"]:
        print_json(out, adapter_list())
        return None
    for status, flag in (("draining", "drain"), ("enabled", "enable"), ("disabled", "disable")):
        if opts[flag]:
            row = adapter_set_status(version=opts[flag], status=status, reason=opts["reason"])
            print_json(out, {"adapter_version": row.adapter_version, "status": row.status})
            return None
    return None
