"""The README's main job: the embedded default end to end against the reference MCP server.

Starts the reference server (the official `mcp` SDK, toolops/reference_server; the optional extra
`reference-server`), registers it, submits calls that complete, fail, return isError and run
synchronously, runs the embedded executor until they are accepted, and prints each one's timeline
and receipt in words a reader follows without the source.
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

from django.conf import settings
from django.db import connection
from django.test import override_settings

from ledger.selectors import operation_snapshot
from ledger.states import State
from toolops.runner import run_embedded
from toolops.services.servers import server_add
from toolops.services.submit import operation_submit

CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("demo-report", "sleep_then_complete", {"seconds": 1.5, "value": "quarterly report ready"}),
    ("demo-upload", "sleep_then_fail", {"seconds": 1.0, "message": "upload is corrupt"}),
    ("demo-mutation", "sleep_then_is_error", {"seconds": 0.5, "message": "3 rows rejected"}),
    ("demo-ping", "quick_sync", {"value": "pong"}),
]

# One line per local state, printed once before the timelines (docs/state-table.md has the table).
STATE_LEGEND: dict[str, str] = {
    State.SUBMITTING: "we are sending the call; the server may or may not have it yet",
    State.SUBMISSION_UNKNOWN: "the send's answer was lost; we must prove whether a task exists",
    State.WORKING: "the server holds a task for the call; we poll it",
    State.INPUT_REQUIRED: "the server asked a question; polling pauses until it is answered",
    State.CANCEL_REQUESTED: "we asked the server to cancel; waiting for it to confirm",
    State.TERMINAL_OBSERVED: "the server reported a final status; the result is not fetched yet",
    State.FETCHING_RESULT: "fetching the final result (tasks/result) before accepting it",
    State.ACCEPTED: "final: one terminal receipt and one outbox event were written together",
    State.CANCELLED_ACCEPTED: "final: the server confirmed the cancel; receipt written",
    State.NOT_FOUND_SAFE: "final: proven that the server never created the task",
    State.RECONCILIATION_REQUIRED: "the executor could not prove the outcome; an operator decides",
    State.ABANDONED: "final: an operator gave the call up, with a reason",
}

# What a poll outcome of the embedded executor means (the counts printed after the run).
OUTCOME_LEGEND: dict[str, str] = {
    "working": "the task is still running",
    "rate_limited": "held back by the server's QPS budget (no request sent); retried later",
    "accepted": "the final result was fetched and the receipt written",
}


class _Writer(Protocol):
    def write(self, msg: str) -> Any: ...


def _timeline(snapshot: dict[str, Any]) -> list[str]:
    lines = []
    for e in snapshot["events"]:
        moved = e["from_state"] != e["to_state"]
        move = f"{e['from_state'] or '-'} -> {e['to_state']}" if moved else f"(stays {e['to_state']})"
        server = f"  [server says: {e['server_state']}]" if e["server_state"] else ""
        lines.append(f"    #{e['seq']:<3} {e['created_at'][11:23]} {e['kind']:<20} {move}{server}")
    return lines


def _texts(payload: dict[str, Any]) -> str:
    body = payload.get("payload") or {}
    content = body.get("content", []) if isinstance(body, dict) else []
    return "; ".join(c.get("text", "") for c in content if isinstance(c, dict) and c.get("text"))


def _outcome_lines(receipt: dict[str, Any]) -> list[str]:
    """The receipt's verdict in words: what the server said happened, then the text it returned."""
    status = receipt["terminal_status"]
    payload = receipt["payload"] or {}
    text = _texts(payload)
    if status == "failed":
        error = payload.get("status_message") or text or "(the server gave no message)"
        return ["  outcome: FAILED - the task failed on the server",
                f"  error:   {error[:200]}"]
    if status == "cancelled":
        return ["  outcome: CANCELLED - the server confirmed the cancel"]
    if payload.get("is_error"):
        return ["  outcome: COMPLETED, but the tool reported an error (isError=true)",
                f"  error:   {text[:200] or '(no text)'}"]
    return [f"  outcome: {status.upper()}", f"  result:  {text[:200] or '(no text content)'}"]


def _legend(out: _Writer) -> None:
    out.write("Local states (ours; the server's own status is shown as [server says: ...]);\n"
              "the full table and why each move exists: docs/state-table.md\n")
    for name, meaning in STATE_LEGEND.items():
        out.write(f"  {name:<24} {meaning}\n")
    out.write("\n")


def _allow_own_server(url: str) -> Any:
    """The reference server listens on loopback, which the server URL policy refuses unless
    TOOLOPS_SERVER_HOSTS lists it: the demo adds exactly its own server's address, for its run."""
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    return override_settings(TOOLOPS_SERVER_HOSTS=f"{settings.TOOLOPS_SERVER_HOSTS},{host}")


def run_demo(*, out: _Writer) -> int:
    try:
        import mcp  # noqa: F401  (the reference server's SDK: the optional extra)
        import uvicorn  # noqa: F401
    except ImportError:
        out.write('the demo needs the reference server: pip install "toolops[reference-server]"\n')
        return 2
    from toolops.reference_server.launch import running_reference_server

    started = time.monotonic()
    suffix = str(int(time.time() * 1000))
    _legend(out)
    with running_reference_server() as url, _allow_own_server(url):
        out.write(f"reference MCP server (mcp SDK, tasks 2025-11-25) at {url}\n")
        out.write(f"database: {connection.vendor} ({connection.settings_dict['NAME']})\n\n")
        server = server_add(name=f"demo-{suffix}", url=url, sync_bounds={"quick_sync": 5.0})
        ops = []
        answered_at_submit = 0
        for node, tool, args in CALLS:
            op = operation_submit(server_name=server.name, tool_name=tool,
                                  call_node_id=f"{node}-{suffix}", arguments=args, ttl_ms=60_000)
            how = "a task on the server, to poll" if op.remote_id else "answered in the submit call"
            if op.state == State.ACCEPTED:
                answered_at_submit += 1
                how = "a synchronous call: answered and accepted at submit, no polling"
            out.write(f"submitted {tool:<20} call node {op.call_node_id}: {op.state} ({how})\n")
            ops.append(op)
        stats = run_embedded(until_idle=True, max_seconds=60)
        outcomes = dict(stats.outcomes)
        if answered_at_submit:
            outcomes["accepted_at_submit"] = answered_at_submit
        out.write(f"\nembedded executor: {stats.polls} polls of {len(ops) - answered_at_submit} tasks, "
                  f"plus {answered_at_submit} synchronous call(s) accepted at submit\n")
        for outcome, count in sorted(outcomes.items()):
            meaning = OUTCOME_LEGEND.get(outcome, "")
            if outcome == "accepted_at_submit":
                meaning = "a synchronous call: its answer came with the submit; no poll needed"
            out.write(f"  {outcome:<20} {count:>3}  {meaning}\n")
        out.write("\n")
        failures = 0
        for op in ops:
            snap = operation_snapshot(operation_id=op.id)
            out.write(f"{snap['tool_name']} [{snap['call_node_id']}] -> {snap['state']}\n")
            out.write("\n".join(_timeline(snap)) + "\n")
            receipt = snap["receipt"]
            if receipt is None:
                failures += 1
                out.write("  receipt: none (the call has no accepted terminal state)\n\n")
                continue
            out.write("\n".join(_outcome_lines(receipt)) + "\n")
            shown = {k: receipt[k] for k in ("id", "terminal_status", "result_digest", "remote_id")}
            out.write(f"  receipt: {json.dumps(shown)}\n")
            out.write(f"  outbox rows: {len(snap['outbox'])} (the event downstream code advances on)\n\n")
    out.write(f"{len(ops) - failures}/{len(ops)} calls accepted in {time.monotonic() - started:.1f}s "
              "(accepted = one terminal receipt each, whether the call succeeded or failed)\n")
    return 0 if failures == 0 else 1
