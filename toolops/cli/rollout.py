"""`toolops rollout`: set the canary share, shadow mode or read-only flag; or print the shadow report."""

from __future__ import annotations

import getpass
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from ledger.selectors import shadow_report
from toolops.cli.base import Output, print_json

NAME = "rollout"
HELP = "set canary percent / shadow, or print the shadow report"

_FLAGS: dict[str | None, bool | None] = {"on": True, "off": False, None: None}


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--server", default=None)
    parser.add_argument("--tool", default="")
    parser.add_argument("--canary-percent", type=float, default=None)
    parser.add_argument("--shadow", choices=["on", "off"], default=None)
    parser.add_argument("--read-only", choices=["on", "off"], default=None,
                        help="declare the tool side-effect free (for servers without readOnlyHint)")
    parser.add_argument("--reason", default="")
    parser.add_argument("--actor", default=None)
    parser.add_argument("--report", action="store_true", help="print the shadow report")


def run(*, opts: dict[str, Any], out: Output, err: Output) -> int | None:
    from toolops.services.rollout import rollout_configure

    changing = (opts["canary_percent"], opts["shadow"], opts["read_only"]) != (None,) * 3
    result: dict[str, Any] = {}
    if changing:
        if not opts["server"]:
            raise CommandError("--server is required to change a rollout")
        change = rollout_configure(
            server_name=opts["server"], tool_name=opts["tool"], reason=opts["reason"],
            actor=opts["actor"] or f"cli:{getpass.getuser()}",
            canary_percent=opts["canary_percent"], shadow=_FLAGS[opts["shadow"]],
            declared_read_only=_FLAGS[opts["read_only"]],
        )
        result["change"] = {"id": change.pk, "before": change.before, "after": change.after}
    if opts["report"] or not changing:
        result["shadow_report"] = shadow_report(server_name=opts["server"],
                                                tool_name=opts["tool"] or None)
    print_json(out, result)
    return None
