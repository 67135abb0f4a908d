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

        p = sub.add_parser("cancel", help="request a cancel and print the operation (as show)")
        p.add_argument("operation", help="operation id, remote (task) id or submission key")

        p = sub.add_parser("answer", help="answer one input round and print the operation")
        p.add_argument("operation", help="operation id, remote (task) id or submission key")
        p.add_argument("--round", dest="input_round", type=int, required=True)
        p.add_argument("--json", dest="answer_json", required=True,
                       help='the answer: {"action": ..., "content": {...}} or bare content (accept)')
        p.add_argument("--schema-digest", default=None,
                       help="digest of the schema you answered (default: the round's own, from show)")

        p = sub.add_parser("run", help="the embedded executor")
        p.add_argument("--until-idle", action="store_true")
        p.add_argument("--max-seconds", type=float, default=None)

        sub.add_parser("demo", help="the README's main job against the reference server")

        p = sub.add_parser("reconcile", help="the manual reconciliation queue")
        mode = p.add_mutually_exclusive_group(required=True)
        mode.add_argument("--list", action="store_true", help="open items, oldest first")
        mode.add_argument("--resolve", type=int, metavar="ITEM", help="resolve one item")
        p.add_argument("--overdue", action="store_true", help="with --list: only items past deadline")
        p.add_argument("--action", choices=["attach_remote_id", "never_created", "accept_terminal",
                                            "abandoned"])
        p.add_argument("--reason", default="")
        p.add_argument("--remote-id", default="")
        p.add_argument("--terminal-status", default="")
        p.add_argument("--evidence", default=None, help="JSON object: what was observed")
        p.add_argument("--actor", default=None, help="who resolves (default: cli:<os user>)")

        p = sub.add_parser("polls", help="per-server poll figures: configured QPS vs observed")
        p.add_argument("--json", action="store_true", help="one JSON document instead of a table")
        p.add_argument("--server", action="append", default=None, help="limit to these servers")

        p = sub.add_parser("gate", help="the release gate: six figures, exit 1 on any failure")
        p.add_argument("--json", action="store_true")
        p.add_argument("--server", action="append", default=None, help="limit to these servers")

        p = sub.add_parser("simulate", help="seeded simulation over in-process servers, then the gate")
        p.add_argument("--series", type=int, default=500)
        p.add_argument("--seed", type=int, default=20261129)
        p.add_argument("--only", type=int, default=None, help="replay one series index alone")
        p.add_argument("--workers", type=int, default=4, help="poll threads per tick (1: sequential)")
        p.add_argument("--inject-lie", type=int, action="append", default=[],
                       help="test hook: the server misreports this series' ground truth")
        p.add_argument("--json", action="store_true")

        p = sub.add_parser("rollback", help="move new calls and in-flight rows to one executor path")
        p.add_argument("--to", dest="to_path", required=True, choices=["legacy", "tasks"])
        p.add_argument("--reason", required=True)
        p.add_argument("--server", default=None, help="one server (default: every server)")
        p.add_argument("--tool", default="", help="one tool of --server")
        p.add_argument("--actor", default=None, help="who (default: cli:<os user>)")

        p = sub.add_parser("rollout", help="set canary percent / shadow, or print the shadow report")
        p.add_argument("--server", default=None)
        p.add_argument("--tool", default="")
        p.add_argument("--canary-percent", type=float, default=None)
        p.add_argument("--shadow", choices=["on", "off"], default=None)
        p.add_argument("--read-only", choices=["on", "off"], default=None,
                       help="declare the tool side-effect free (for servers without readOnlyHint)")
        p.add_argument("--reason", default="")
        p.add_argument("--actor", default=None)
        p.add_argument("--report", action="store_true", help="print the shadow report")

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

    def _cancel(self, opts: dict[str, Any]) -> None:
        from toolops.services.cancel import operation_cancel

        op = operation_find(ref=opts["operation"])
        if op is None:
            raise CommandError(f"no operation matches {opts['operation']!r}")
        operation_cancel(operation_id=op.id)
        self._print(operation_snapshot(operation_id=op.id))

    def _answer(self, opts: dict[str, Any]) -> None:
        from ledger.selectors import input_request_get
        from toolops.services.inputs import operation_answer_input

        op = operation_find(ref=opts["operation"])
        if op is None:
            raise CommandError(f"no operation matches {opts['operation']!r}")
        response = _json_arg(opts["answer_json"], flag="--json")
        digest = opts["schema_digest"]
        if digest is None:
            ir = input_request_get(operation_id=op.id, input_round=opts["input_round"])
            digest = ir.schema_digest if ir is not None else ""
        operation_answer_input(operation_id=op.id, input_round=opts["input_round"],
                               schema_digest=digest, response=response)
        self._print(operation_snapshot(operation_id=op.id))

    def _run(self, opts: dict[str, Any]) -> None:
        from toolops.runner import run_embedded

        stats = run_embedded(until_idle=opts["until_idle"], max_seconds=opts["max_seconds"])
        self._print({"polls": stats.polls, "outcomes": stats.outcomes})

    def _reconcile(self, opts: dict[str, Any]) -> None:
        if opts["list"]:
            from ledger.selectors.reconciliation import reconciliation_items_open

            self._print([
                {"item": i.id, "operation_id": str(i.operation_id), "reason": i.reason,
                 "state": i.operation.state, "remote_id": i.operation.remote_id,
                 "submission_key": i.operation.submission_key, "deadline": i.deadline.isoformat(),
                 "created_at": i.created_at.isoformat(), "owner": i.owner.get_username() if i.owner else ""}
                for i in reconciliation_items_open(overdue_only=opts["overdue"])
            ])
            return
        import getpass

        from toolops.services.reconcile import reconciliation_resolve

        if not opts["action"]:
            raise CommandError("--resolve needs --action")
        evidence = _json_arg(opts["evidence"], flag="--evidence")
        if evidence is not None and not isinstance(evidence, dict):
            raise CommandError("--evidence must be a JSON object")
        item = reconciliation_resolve(
            item_id=opts["resolve"], action=opts["action"], reason=opts["reason"],
            actor=opts["actor"] or f"cli:{getpass.getuser()}", remote_id=opts["remote_id"],
            terminal_status=opts["terminal_status"], evidence=evidence,
        )
        self._print({"item": item.id, "status": item.status, "resolution": item.resolution,
                     "resolved_by": item.resolved_by, "operation_id": str(item.operation_id)})

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

    def _gate(self, opts: dict[str, Any]) -> None:
        from toolops.gate_render import gate_render_json, gate_render_text, gate_summary
        from toolops.services.gate import gate_report

        report = gate_report(server_names=opts["server"])
        self.stdout.write(gate_render_json(report) if opts["json"] else gate_render_text(report))
        if not report.passed:
            self.stderr.write(gate_summary(report))
            sys.exit(1)

    def _simulate(self, opts: dict[str, Any]) -> None:
        from toolops.simulation.command import simulate_command

        sys.exit(simulate_command(series=opts["series"], seed=opts["seed"], only=opts["only"],
                                  workers=opts["workers"], lie_about=frozenset(opts["inject_lie"]),
                                  as_json=opts["json"], out=self.stdout,
                                  err=self.stderr))

    def _rollback(self, opts: dict[str, Any]) -> None:
        import getpass

        from toolops.services.rollout import rollout_move

        if opts["tool"] and not opts["server"]:
            raise CommandError("--tool needs --server")
        change = rollout_move(
            to_path=opts["to_path"], reason=opts["reason"],
            actor=opts["actor"] or f"cli:{getpass.getuser()}", server_name=opts["server"],
            tool_name=opts["tool"],
        )
        self._print({"change": change.pk, "action": change.action, "actor": change.actor,
                     "reason": change.reason, "from": change.from_path, "to": change.to_path,
                     "rows_moved": change.rows_moved, "after": change.after})

    def _rollout(self, opts: dict[str, Any]) -> None:
        import getpass

        from ledger.selectors.rollout import shadow_report
        from toolops.services.rollout import rollout_configure

        flags = {"on": True, "off": False, None: None}
        changing = (opts["canary_percent"], opts["shadow"], opts["read_only"]) != (None,) * 3
        out: dict[str, Any] = {}
        if changing:
            if not opts["server"]:
                raise CommandError("--server is required to change a rollout")
            change = rollout_configure(
                server_name=opts["server"], tool_name=opts["tool"], reason=opts["reason"],
                actor=opts["actor"] or f"cli:{getpass.getuser()}",
                canary_percent=opts["canary_percent"], shadow=flags[opts["shadow"]],
                declared_read_only=flags[opts["read_only"]],
            )
            out["change"] = {"id": change.pk, "before": change.before, "after": change.after}
        if opts["report"] or not changing:
            out["shadow_report"] = shadow_report(server_name=opts["server"],
                                                 tool_name=opts["tool"] or None)
        self._print(out)

    def _demo(self, opts: dict[str, Any]) -> None:
        from toolops.demo import run_demo

        sys.exit(run_demo(out=self.stdout))
