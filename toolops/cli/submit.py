"""`toolops submit`: submit one tool call for a call node."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from toolops.cli.base import Output, json_arg, print_json

NAME = "submit"
HELP = "submit one tool call for a call node"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--server", required=True)
    parser.add_argument("--tool", required=True)
    parser.add_argument("--call-node", required=True)
    parser.add_argument("--args", dest="args_json", default="{}")
    parser.add_argument("--ttl-ms", type=int, default=None)


def run(*, opts: dict[str, Any], out: Output, err: Output) -> int | None:
    from toolops.services.submit import operation_submit

    arguments = json_arg(opts["args_json"], flag="--args")
    if not isinstance(arguments, dict):
        raise CommandError("--args must be a JSON object")
    op = operation_submit(
        server_name=opts["server"], tool_name=opts["tool"], call_node_id=opts["call_node"],
        arguments=arguments, ttl_ms=opts["ttl_ms"],
    )
    print_json(out, {"operation_id": str(op.id), "state": op.state,
                     "submission_key": op.submission_key, "remote_id": op.remote_id,
                     "server_state": op.server_state})
    return None
