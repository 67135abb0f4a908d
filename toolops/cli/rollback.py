"""`toolops rollback --to legacy|tasks`: move new calls and in-flight rows to one executor path."""

from __future__ import annotations

import getpass
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from toolops.cli.base import Output, print_json

NAME = "rollback"
HELP = "move new calls and in-flight rows to one executor path"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--to", dest="to_path", required=True, choices=["legacy", "tasks"])
    parser.add_argument("--reason", required=True)
    parser.add_argument("--server", default=None, help="one server (default: every server)")
    parser.add_argument("--tool", default="", help="one tool of --server")
    parser.add_argument("--actor", default=None, help="who (default: cli:<os user>)")


def run(*, opts: dict[str, Any], out: Output, err: Output) -> int | None:
    from toolops.services.rollout import rollout_move

    if opts["tool"] and not opts["server"]:
        raise CommandError("--tool needs --server")
    change = rollout_move(
        to_path=opts["to_path"], reason=opts["reason"],
        actor=opts["actor"] or f"cli:{getpass.getuser()}", server_name=opts["server"],
        tool_name=opts["tool"],
    )
    print_json(out, {"change": change.pk, "action": change.action, "actor": change.actor,
                     "reason": change.reason, "from": change.from_path, "to": change.to_path,
                     "rows_moved": change.rows_moved, "after": change.after})
    return None
