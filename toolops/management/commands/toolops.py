"""`python manage.py toolops <subcommand>`: a contract other tooling relies on.

Each subcommand is thin: parse, call one service, print JSON. Errors exit non-zero with one line.
"""

from __future__ import annotations

import json
import sys
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.errors import LedgerError
from ledger.selectors import operation_find, operation_snapshot
from toolops.errors import ToolopsError


def _json_arg(raw: str | None, *, flag: str) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CommandError(f"{flag} is not valid JSON: {exc.msg} at position {exc.pos}") from exc


class Command(BaseCommand):
    help = "toolops: submit, run and inspect long-running tool calls"

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True)

        p: ArgumentParser = sub.add_parser("server-add", help="negotiate with and register a server")
        p.add_argument("name")
        p.add_argument("--url", required=True)
        p.add_argument("--adapter", default="mcp-tasks/2025-11-25",
                       help="an adapter version, or 'auto' to negotiate the shape")
        p.add_argument("--adapter-options", default=None,
                       help='JSON object of adapter settings (aip-151/v1: {"methods": {tool: '
                            '{"http_method": "POST", "path": "v1/...:verb"}}, "operations_prefix": "v1"})')
        p.add_argument("--max-qps", type=float, default=10.0)
        p.add_argument("--sync-bounds", default=None,
                       help='JSON object: tool name -> synchronous upper bound in seconds')

        p = sub.add_parser("adapter", help="list adapter versions; drain, enable or disable one")
        action = p.add_mutually_exclusive_group(required=True)
        action.add_argument("--list", action="store_true")
        action.add_argument("--drain", metavar="VERSION")
        action.add_argument("--enable", metavar="VERSION")
        action.add_argument("--disable", metavar="VERSION")
        p.add_argument("--reason", default="")

        p = sub.add_parser("submit", help="submit one tool call for a call node")
        p.add_argument("--server", required=True)
        p.add_argument("--tool", required=True)
        p.add_argument("--call-node", required=True)
        p.add_argument("--args", dest="args_json", default="{}")
        p.add_argument("--ttl-ms", type=int, default=None)

        p = sub.add_parser("show", help="print one operation with events, receipt and outbox")
        p.add_argument("operation", help="operation id, remote (task) id or submission key")

        p = sub.add_parser("run", help="the embedded executor")
        p.add_argument("--until-idle", action="store_true")
        p.add_argument("--max-seconds", type=float, default=None)

        sub.add_parser("demo", help="the README's main job against the reference server")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            getattr(self, "_" + opts["subcommand"].replace("-", "_"))(opts)
        except (ToolopsError, LedgerError) as exc:
            raise CommandError(str(exc)) from exc

    def _print(self, value: Any) -> None:
        self.stdout.write(json.dumps(value, sort_keys=True, default=str))

    def _server_add(self, opts: dict[str, Any]) -> None:
        from toolops.services.servers import server_add

        bounds = _json_arg(opts["sync_bounds"], flag="--sync-bounds") or {}
        if not isinstance(bounds, dict):
            raise CommandError("--sync-bounds must be a JSON object")
        options = _json_arg(opts["adapter_options"], flag="--adapter-options")
        if options is not None and not isinstance(options, dict):
            raise CommandError("--adapter-options must be a JSON object")
        server = server_add(
            name=opts["name"], url=opts["url"], adapter_version=opts["adapter"],
            max_qps=opts["max_qps"], sync_bounds=bounds, options=options,
        )
        self._print({"name": server.name, "url": server.url, "adapter": server.adapter_version,
                     "protocol_version": server.protocol_version, "tools": sorted(server.tools),
                     "max_qps": server.max_qps})

    def _adapter(self, opts: dict[str, Any]) -> None:
        from toolops.services.adapters_admin import adapter_list, adapter_set_status

        if opts["list"]:
            self._print(adapter_list())
            return
        for status, flag in (("draining", "drain"), ("enabled", "enable"), ("disabled", "disable")):
            if opts[flag]:
                row = adapter_set_status(version=opts[flag], status=status, reason=opts["reason"])
                self._print({"adapter_version": row.adapter_version, "status": row.status})
                return

    def _submit(self, opts: dict[str, Any]) -> None:
        from toolops.services.submit import operation_submit

        arguments = _json_arg(opts["args_json"], flag="--args")
        if not isinstance(arguments, dict):
            raise CommandError("--args must be a JSON object")
        op = operation_submit(
            server_name=opts["server"], tool_name=opts["tool"], call_node_id=opts["call_node"],
            arguments=arguments, ttl_ms=opts["ttl_ms"],
        )
        self._print({"operation_id": str(op.id), "state": op.state,
                     "submission_key": op.submission_key, "remote_id": op.remote_id,
                     "server_state": op.server_state})

    def _show(self, opts: dict[str, Any]) -> None:
        op = operation_find(ref=opts["operation"])
        if op is None:
            raise CommandError(f"no operation matches {opts['operation']!r}")
        self._print(operation_snapshot(operation_id=op.id))

    def _run(self, opts: dict[str, Any]) -> None:
        from toolops.runner import run_embedded

        stats = run_embedded(until_idle=opts["until_idle"], max_seconds=opts["max_seconds"])
        self._print({"polls": stats.polls, "outcomes": stats.outcomes})

    def _demo(self, opts: dict[str, Any]) -> None:
        from toolops.demo import run_demo

        sys.exit(run_demo(out=self.stdout))
