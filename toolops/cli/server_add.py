"""`toolops server-add NAME --url URL`: negotiate with a server and register it."""

from __future__ import annotations

import getpass
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from toolops.cli.base import Output, json_arg, json_object_arg, print_json

NAME = "server-add"
HELP = "negotiate with and register a server"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("name")
    parser.add_argument("--url", required=True)
    parser.add_argument("--adapter", default="mcp-tasks/2025-11-25",
                        help="an adapter version, or 'auto' to negotiate the shape")
    parser.add_argument("--adapter-options", default=None,
                        help='JSON object of adapter settings (aip-151/v1: {"methods": {tool: '
                             '{"http_method": "POST", "path": "v1/...:verb"}}, "operations_prefix": "v1"})')
    parser.add_argument("--max-qps", type=float, default=10.0)
    parser.add_argument("--sync-bounds", default=None,
                        help="JSON object: tool name -> synchronous upper bound in seconds")
    parser.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                        help="a credential header sent on every request (stored apart from the URL, "
                             "never shown); repeatable")


def run(*, opts: dict[str, Any], out: Output, err: Output) -> int | None:
    from toolops.services.permissions import actor_system
    from toolops.services.servers import server_add, server_public_view

    bounds = json_arg(opts["sync_bounds"], flag="--sync-bounds") or {}
    if not isinstance(bounds, dict):
        raise CommandError("--sync-bounds must be a JSON object")
    options = json_object_arg(opts["adapter_options"], flag="--adapter-options")
    headers: dict[str, str] = {}
    for raw in opts["header"]:
        name, sep, value = raw.partition(":")
        if not sep or not name.strip():
            raise CommandError("--header must look like 'NAME: VALUE'")
        headers[name.strip()] = value.strip()
    server = server_add(
        name=opts["name"], url=opts["url"], adapter_version=opts["adapter"],
        max_qps=opts["max_qps"], sync_bounds=bounds, options=options,
        credential_headers=headers or None, actor=actor_system(name=f"cli:{getpass.getuser()}"),
    )
    print_json(out, server_public_view(server=server))
    return None
