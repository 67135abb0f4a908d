"""A process SIGKILLed while it holds a task's `tasks/result` stream, against the official SDK server.

What this pins down (docs/conformance.md, "Input rounds across processes"): `mcp` 1.30 hands a
task's elicitation out of its message queue once, on whichever `tasks/result` stream dequeues it,
and keeps no copy (`TaskResultHandler._deliver_queued_messages`). A reader killed after the
request reached it, before it recorded the round, takes the round with it: the next process's
stream gets nothing, ever. The row must not hang or advance on that: each poll records
`input_required_no_new_round`, and at the end of the wait budget the row goes to the
reconciliation queue. The same holds for a round asked after the kill: the dead reader's handler
outlives it and takes that round. If a future SDK re-delivers, these tests fail and the recovery
(the round opening in the next process) must be asserted instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.models import InputRequest, Operation, OperationEvent, ReconciliationItem, ToolServer
from ledger.states import State
from toolops.services.connections import adapter_for_server
from toolops.services.dispatch import operations_claim_due
from toolops.services.inputs import operation_answer_input
from toolops.services.observe import operation_poll
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db

# The killed worker's read, on the wire exactly as `read_input` opens it: a tasks/result POST in
# the shared session, read as SSE; it reports the request it got, then waits to be killed.
READER = textwrap.dedent("""
    import json, sys, time, httpx
    url, session, task_id = sys.argv[1:4]
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
               "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    body = {"jsonrpc": "2.0", "id": "killed-reader", "method": "tasks/result",
            "params": {"taskId": task_id}}
    with httpx.Client(timeout=60) as client, client.stream("POST", url, headers=headers,
                                                           json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and "elicitation/create" in line:
                print(json.loads(line[5:])["id"], flush=True)
                time.sleep(120)
""")


def _poll(op: Operation) -> str:
    Operation.objects.filter(id=op.id).update(next_poll_at=timezone.now())
    assert op.id in operations_claim_due(owner="killed-reader-test")
    return operation_poll(operation_id=op.id, lease_owner="killed-reader-test")


def _round_taken_by_a_killed_reader(server: ToolServer) -> tuple[Operation, str]:
    """A task asking round 1, read by another process that is SIGKILLed holding it: the row and
    the server request id only the dead process saw."""
    op = operation_submit(server_name=server.name, tool_name="ask_input", call_node_id="killed",
                          arguments={"question": "colour?", "rounds": 1}, ttl_ms=300_000)
    assert op.state == State.WORKING and op.remote_id  # round 1 not read by this process
    server.refresh_from_db()
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, server.url, str(server.session_id), op.remote_id],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert reader.stdout is not None
        request_id = reader.stdout.readline().strip()  # the server handed round 1 to it
        assert request_id.startswith(f"task-{op.remote_id}-"), reader.stderr
    finally:
        os.killpg(reader.pid, signal.SIGKILL)  # no notifications/cancelled, no clean close
        reader.wait(timeout=10)
    return op, request_id


def test_a_round_read_by_a_killed_process_is_not_redelivered_and_the_row_reaches_an_operator(
    server: ToolServer,
) -> None:
    op, _ = _round_taken_by_a_killed_reader(server)

    # The next process: the task still says input_required, but its stream carries nothing.
    for _ in range(2):
        assert _poll(op) == "input_required_replayed"
    op.refresh_from_db()
    assert op.state == State.WORKING and op.server_state == "input_required"
    assert not InputRequest.objects.filter(operation=op).exists()
    replays = OperationEvent.objects.filter(operation=op, kind="input_required_no_new_round")
    assert replays.count() == 2
    assert all(e.data["requests_seen"] == [] for e in replays)

    # Never a hang: at the end of the wait budget the row goes to an operator, with the evidence.
    Operation.objects.filter(id=op.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert _poll(op) in ("wait_budget_exhausted", "expired")
    op.refresh_from_db()
    assert op.state == State.RECONCILIATION_REQUIRED
    item = ReconciliationItem.objects.get(operation=op)
    assert item.evidence["server_state"] == "input_required"


def test_the_server_still_waits_for_the_lost_request_id(server: ToolServer) -> None:
    """Only the request is lost, not the task: the SDK keeps its resolver for the id, so an answer
    sent to that id (which only the dead process had read) is still routed and the task ends."""
    op, request_id = _round_taken_by_a_killed_reader(server)
    assert _poll(op) == "input_required_replayed"
    adapter = adapter_for_server(server=server)
    adapter.answer_input(request_id=request_id, result={"action": "accept",
                                                        "content": {"value": "teal"}},
                         remote_id=op.remote_id)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not op.state.startswith("ACCEPTED"):
        time.sleep(0.2)
        _poll(op)
        op.refresh_from_db()
    assert op.state == State.ACCEPTED, op.state
    assert op.receipt.payload["payload"]["structuredContent"] == {"answers": ["teal"]}


# A killed worker's stream opened while the task had nothing queued: it reports the open stream
# and waits to be killed; the server's handler for it waits on the task's queue.
IDLE_READER = textwrap.dedent("""
    import sys, time, httpx
    url, session, task_id = sys.argv[1:4]
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
               "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    body = {"jsonrpc": "2.0", "id": "orphaned-reader", "method": "tasks/result",
            "params": {"taskId": task_id}}
    with httpx.Client(timeout=60) as client, client.stream("POST", url, headers=headers,
                                                           json=body) as response:
        print(response.status_code, flush=True)
        time.sleep(120)
""")


def test_a_killed_readers_handler_swallows_the_next_round(server: ToolServer) -> None:
    """The second case: the dead reader held a stream with nothing on it. Its handler on the
    server outlives it (only `notifications/cancelled` for its id stops it) and takes the round
    the task asks next, which no later stream gets."""
    op = operation_submit(server_name=server.name, tool_name="ask_input", call_node_id="orphan",
                          arguments={"question": "colour?", "rounds": 2}, ttl_ms=300_000)
    deadline = time.monotonic() + 15
    while op.state != State.INPUT_REQUIRED and time.monotonic() < deadline:
        _poll(op)
        op.refresh_from_db()
    assert op.state == State.INPUT_REQUIRED and op.input_round == 1  # round 1, read here
    server.refresh_from_db()
    reader = subprocess.Popen(
        [sys.executable, "-c", IDLE_READER, server.url, str(server.session_id), op.remote_id],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert reader.stdout is not None
        assert reader.stdout.readline().strip() == "200", reader.stderr
        time.sleep(0.5)  # the server is running the handler for that request
    finally:
        os.killpg(reader.pid, signal.SIGKILL)
        reader.wait(timeout=10)

    ir = InputRequest.objects.get(operation=op, round=1)
    assert operation_answer_input(operation_id=op.id, input_round=1, schema_digest=ir.schema_digest,
                                  response={"value": "teal"}) == "delivered"
    for _ in range(2):
        assert _poll(op) == "input_required_replayed"
    op.refresh_from_db()
    assert op.state == State.WORKING and op.server_state == "input_required"
    assert not InputRequest.objects.filter(operation=op, round=2).exists()
