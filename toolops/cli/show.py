"""`toolops show REF`: one operation with every ledger field, events, receipt and outbox."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from ledger.selectors import operation_snapshot
from toolops.cli.base import Output, add_operation_ref, operation_by_ref, print_json

NAME = "show"
HELP = "print one operation with events, receipt and outbox"


def add_arguments(parser: ArgumentParser) -> None:
    add_operation_ref(parser)


def run(*, opts: dict[str, Any], out: Output, err: Output) -> int | None:
    op = operation_by_ref(ref=opts["operation"])
    print_json(out, operation_snapshot(operation_id=op.id))
    return None
