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
        p.add_argument("--adapter", default="mcp-tasks/2025-11-25")
        p.add_argument("--max-qps", type=float, default=10.0)
        p.add_argument("--sync-bounds", default=None,
                       help='JSON object: tool name -> synchronous upper bound in seconds')

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

        p = sub.add_parser("polls", help="per-server poll figures: configured QPS vs observed")
        p.add_argument("--json", action="store_true", help="one JSON document instead of a table")
        p.add_argument("--server", action="append", default=None, help="limit to these servers")

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
        server = server_add(
            name=opts["name"], url=opts["url"], adapter_version=opts["adapter"],
            max_qps=opts["max_qps"], sync_bounds=bounds,
        )
        self._print({"name": server.name, "url": server.url, "adapter": server.adapter_version,
                     "protocol_version": server.protocol_version, "tools": sorted(server.tools),
                     "max_qps": server.max_qps})

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

    def _polls(self, opts: dict[str, Any]) -> None:
        from toolops.services.poll_report import poll_report_servers

        figures = [f.as_dict() for f in poll_report_servers(names=opts["server"])]
        if opts["json"]:
            self._print({"servers": figures})
            return
        columns = ("server", "configured_qps", "peak_requests_in_one_second",
                   "peak_over_configured", "total_requests", "refused_tokens", "operations",
                   "polls_per_operation")
        self.stdout.write("  ".join(columns))
        for row in figures:
            self.stdout.write("  ".join(str(row[c]) for c in columns))

    def _demo(self, opts: dict[str, Any]) -> None:
        from toolops.demo import run_demo

        sys.exit(run_demo(out=self.stdout))
