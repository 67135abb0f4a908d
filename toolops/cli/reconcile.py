"""`toolops reconcile`: list the manual reconciliation queue, or resolve one item with who and why."""

from __future__ import annotations

import getpass
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from ledger.selectors import reconciliation_items_open
from toolops.cli.base import Output, json_object_arg, print_json

NAME = "reconcile"
HELP = "the manual reconciliation queue"


def add_arguments(parser: ArgumentParser) -> None:
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--list", action="store_true", help="open items, oldest first")
    mode.add_argument("--resolve", type=int, metavar="ITEM", help="resolve one item")
    parser.add_argument("--overdue", action="store_true", help="with --list: only items past deadline")
    parser.add_argument("--action", choices=["attach_remote_id", "never_created", "accept_terminal",
                                             "abandoned"])
    parser.add_argument("--reason", default="")
    parser.add_argument("--remote-id", default="")
    parser.add_argument("--terminal-status", default="")
    parser.add_argument("--evidence", default=None, help="JSON object: what was observed")
    parser.add_argument("--actor", default=None, help="who resolves (default: cli:<os user>)")


def run(*, opts: dict[str, Any], out: Output, err: Output) -> int | None:
    if opts["list"]:
        print_json(out, [
            {"item": i.id, "operation_id": str(i.operation_id), "reason": i.reason,
             "state": i.operation.state, "remote_id": i.operation.remote_id,
             "submission_key": i.operation.submission_key, "deadline": i.deadline.isoformat(),
             "created_at": i.created_at.isoformat(), "owner": i.owner.get_username() if i.owner else ""}
            for i in reconciliation_items_open(overdue_only=opts["overdue"])
        ])
        return None
    from toolops.services.reconcile import reconciliation_resolve

    if not opts["action"]:
        raise CommandError("--resolve needs --action")
    evidence = json_object_arg(opts["evidence"], flag="--evidence")
    item = reconciliation_resolve(
        item_id=opts["resolve"], action=opts["action"], reason=opts["reason"],
        actor=opts["actor"] or f"cli:{getpass.getuser()}", remote_id=opts["remote_id"],
        terminal_status=opts["terminal_status"], evidence=evidence,
    )
    print_json(out, {"item": item.id, "status": item.status, "resolution": item.resolution,
                     "resolved_by": item.resolved_by, "operation_id": str(item.operation_id)})
    return None
