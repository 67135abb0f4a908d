"""The README's main job: the embedded default end to end against the reference MCP server.

Starts the reference server (built on the official `mcp` SDK, in tests/peers), registers it,
submits calls that complete, fail, return isError and run synchronously, runs the embedded executor
until they are accepted, and prints each one's timeline and receipt.
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

from django.conf import settings
from django.db import connection
from django.test import override_settings

from ledger.selectors import operation_snapshot
from toolops.runner import run_embedded
from toolops.services.servers import server_add
from toolops.services.submit import operation_submit

CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("demo-report", "sleep_then_complete", {"seconds": 1.5, "value": "quarterly report ready"}),
    ("demo-upload", "sleep_then_fail", {"seconds": 1.0, "message": "upload is corrupt"}),
    ("demo-mutation", "sleep_then_is_error", {"seconds": 0.5, "message": "3 rows rejected"}),
    ("demo-ping", "quick_sync", {"value": "pong"}),
]


def _timeline(snapshot: dict[str, Any]) -> list[str]:
    lines = []
    for e in snapshot["events"]:
        moved = e["from_state"] != e["to_state"]
        move = f"{e['from_state'] or '-'} -> {e['to_state']}" if moved else e["to_state"]
        server = f" server={e['server_state']}" if e["server_state"] else ""
        lines.append(f"    #{e['seq']:<3} {e['created_at'][11:23]} {e['kind']:<20} {move}{server}")
    return lines


class _Writer(Protocol):
    def write(self, msg: str) -> Any: ...


def _result_line(payload: dict[str, Any] | None) -> str:
    if payload is None:
        return "none"
    body = payload.get("payload") or {}
    texts = [c.get("text", "") for c in body.get("content", []) if isinstance(c, dict)]
    detail = "; ".join(t for t in texts if t) or payload.get("status_message") or payload["kind"]
    return f"{payload['kind']} is_error={payload['is_error']}: {detail[:120]}"


def _allow_own_server(url: str) -> Any:
    """The reference server listens on loopback, which the server URL policy refuses unless
    TOOLOPS_SERVER_HOSTS lists it: the demo adds exactly its own server's address, for its run."""
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    return override_settings(TOOLOPS_SERVER_HOSTS=f"{settings.TOOLOPS_SERVER_HOSTS},{host}")


def run_demo(*, out: _Writer) -> int:
    try:
        from tests.peers.launch import running_reference_server
    except ImportError:
        out.write("the demo needs the reference server: install requirements-dev.txt\n")
        return 2
    started = time.monotonic()
    suffix = str(int(time.time() * 1000))
    with running_reference_server() as url, _allow_own_server(url):
        out.write(f"reference MCP server (mcp SDK, tasks 2025-11-25) at {url}\n")
        out.write(f"database: {connection.vendor} ({connection.settings_dict['NAME']})\n")
        server = server_add(name=f"demo-{suffix}", url=url, sync_bounds={"quick_sync": 5.0})
        ops = []
        for node, tool, args in CALLS:
            op = operation_submit(server_name=server.name, tool_name=tool,
                                  call_node_id=f"{node}-{suffix}", arguments=args, ttl_ms=60_000)
            out.write(f"submitted {tool:<22} call node {op.call_node_id}: {op.state}\n")
            ops.append(op)
        stats = run_embedded(until_idle=True, max_seconds=60)
        out.write(f"embedded executor: {stats.polls} polls, outcomes {stats.outcomes}\n\n")
        failures = 0
        for op in ops:
            snap = operation_snapshot(operation_id=op.id)
            out.write(f"{snap['tool_name']} [{snap['call_node_id']}] -> {snap['state']}\n")
            out.write("\n".join(_timeline(snap)) + "\n")
            receipt = snap["receipt"]
            if receipt is None:
                failures += 1
                out.write("  receipt: none\n\n")
                continue
            shown = {k: receipt[k] for k in ("id", "terminal_status", "result_digest", "remote_id")}
            out.write(f"  receipt: {json.dumps(shown)}\n")
            out.write(f"  result: {_result_line(receipt['payload'])}\n")
            out.write(f"  outbox rows: {len(snap['outbox'])}\n\n")
    out.write(f"{len(ops) - failures}/{len(ops)} calls accepted in {time.monotonic() - started:.1f}s\n")
    return 0 if failures == 0 else 1
