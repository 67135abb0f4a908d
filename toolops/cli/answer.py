"""`toolops answer REF --round N --json JSON`: answer one input round, then print the operation."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from ledger.selectors import input_request_get, operation_snapshot
from toolops.cli.base import Output, add_operation_ref, json_arg, operation_by_ref, print_json

NAME = "answer"
HELP = "answer one input round and print the operation"


def add_arguments(parser: ArgumentParser) -> None:
    add_operation_ref(parser)
    parser.add_argument("--round", dest="input_round", type=int, required=True)
    parser.add_argument("--json", dest="answer_json", required=True,
                        help='the answer: {"action": ..., "content": {...}} or bare content (accept)')
    parser.add_argument("--schema-digest", default=None,
                        help="digest of the schema you answered (default: the round's own, from show)")


def run(*, opts: dict[str, Any], out: Output, err: Output) -> int | None:
    from toolops.services.inputs import operation_answer_input

    op = operation_by_ref(ref=opts["operation"])
    response = json_arg(opts["answer_json"], flag="--json")
    digest = opts["schema_digest"]
    if digest is None:
        ir = input_request_get(operation_id=op.id, input_round=opts["input_round"])
        digest = ir.schema_digest if ir is not None else ""
    operation_answer_input(operation_id=op.id, input_round=opts["input_round"],
                           schema_digest=digest, response=response)
    print_json(out, operation_snapshot(operation_id=op.id))
    return None
