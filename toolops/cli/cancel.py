"""`toolops cancel REF`: request a cancel, then print the operation as `show` does."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from ledger.selectors import operation_snapshot
from toolops.cli.base import Output, add_operation_ref, operation_by_ref, print_json

NAME = "cancel"
HELP = "request a cancel and print the operation (as show)"


def add_arguments(parser: ArgumentParser) -> None:
    add_operation_ref(parser)


def run(*, opts: dict[str, Any], out: Output, err: Output) -> int | None:
    from toolops.services.cancel import operation_cancel

    op = operation_by_ref(ref=opts["operation"])
    operation_cancel(operation_id=op.id)
    print_json(out, operation_snapshot(operation_id=op.id))
    return None
