"""Shape A conformance: each cell of the table, one test, against a server told to answer that way.

The server is tests/peers/status_server.py (real HTTP on loopback): the official SDK server cannot
be made to answer a create reply `completed` or a cancel with `working`, so the cells are walked
against this scriptable one; the SDK server's own behaviour is in test_flow_mcp_tasks.py,
test_inputs.py and the cross-process lifecycle test. The walk asserts, per cell, the event the
table names and the move (or stay) it names, and that nothing crashed.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from ledger.models import Operation, OperationEvent, ToolServer
from ledger.states import State
from tests.peers.scripted_http import serving_in_thread
from tests.peers.status_server import STATE, serve
from tests.toolops.conformance_walk import cell_id, check_cell, poll_once, wire_status
from toolops.conformance import SHAPE_A, Cell, cells_for
from toolops.services.cancel import operation_cancel
from toolops.services.servers import server_add
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db

TERMINAL = ("completed", "failed", "cancelled")
@pytest.fixture(scope="module")
def status_url() -> Iterator[str]:
    with serving_in_thread(serve(0)) as base:
        yield f"{base}/mcp"


@pytest.fixture
def server(status_url: str) -> ToolServer:
    return server_add(name="status", url=status_url, max_qps=50)


def _submit(script: dict[str, Any], node: str) -> Operation:
    return operation_submit(server_name="status", tool_name="scripted", call_node_id=node,
                            arguments={"script": script}, ttl_ms=60_000)


@pytest.mark.parametrize("cell", cells_for(adapter=SHAPE_A, position="create_reply"), ids=cell_id)
def test_create_reply(server: ToolServer, cell: Cell) -> None:
    status = wire_status(cell.status)
    op = _submit({"create": status, "get": [status if status in TERMINAL else "completed"]},
                 node=f"create-{status}")
    op.refresh_from_db()
    check_cell(op, cell)
    if cell.status == "input_required":
        # Round 1 is open, the remote id recorded with it.
        assert op.state == State.INPUT_REQUIRED and op.remote_id and op.input_round == 1
        assert op.input_requests.get(round=1).status == "open"


@pytest.mark.parametrize("cell", [c for c in cells_for(adapter=SHAPE_A, position="get")
                                  if c.from_state == State.WORKING], ids=cell_id)
def test_get_while_working(server: ToolServer, cell: Cell) -> None:
    status = wire_status(cell.status)
    op = _submit({"create": "working", "get": [status, "completed"] if status == "input_required"
                  else [status]}, node=f"get-{status}")
    assert op.state == State.WORKING
    poll_once(op)
    op.refresh_from_db()
    check_cell(op, cell)


@pytest.mark.parametrize("cell", [c for c in cells_for(adapter=SHAPE_A, position="get")
                                  if c.from_state == State.CANCEL_REQUESTED], ids=cell_id)
def test_get_while_a_cancel_is_pending(server: ToolServer, cell: Cell) -> None:
    status = wire_status(cell.status)
    # The cancel reply says `working` (no evidence), so the row polls in CANCEL_REQUESTED.
    op = _submit({"create": "working", "get": [status], "cancel": "working"},
                 node=f"cget-{status}")
    operation_cancel(operation_id=op.id)
    op.refresh_from_db()
    assert op.state == State.CANCEL_REQUESTED
    poll_once(op)
    op.refresh_from_db()
    check_cell(op, cell)


@pytest.mark.parametrize("cell", cells_for(adapter=SHAPE_A, position="cancel_reply"), ids=cell_id)
def test_cancel_reply(server: ToolServer, cell: Cell) -> None:
    status = wire_status(cell.status)
    op = _submit({"create": "working", "get": ["working"], "cancel": status},
                 node=f"cancel-{status}")
    operation_cancel(operation_id=op.id)
    op.refresh_from_db()
    check_cell(op, cell)


@pytest.mark.parametrize("cell", cells_for(adapter=SHAPE_A, position="cancel_refused_read"),
                         ids=cell_id)
def test_read_after_a_cancel_refused_as_already_terminal(server: ToolServer, cell: Cell) -> None:
    status = wire_status(cell.status)
    script: dict[str, Any] = {"create": "working", "get": [status], "cancel": "error"}
    if status in RESULTS:
        script["result"] = RESULTS[status]
    op = _submit(script, node=f"refused-{status}")
    operation_cancel(operation_id=op.id)
    op.refresh_from_db()
    check_cell(op, cell)
    if cell.to_state is None:
        assert op.state == State.CANCEL_REQUESTED and not op.terminal_status, op.terminal_status


def test_a_stale_working_read_after_already_terminal_never_becomes_the_receipt(
        server: ToolServer) -> None:
    """-32602 to the cancel, then a reordered `working` read, then the real `completed`: the
    receipt carries `completed` (the status a later poll read), never the contradicting read."""
    op = _submit({"create": "working", "get": ["working", "completed"], "cancel": "error",
                  "result": RESULTS["completed"]}, node="refused-stale-working")
    assert operation_cancel(operation_id=op.id) == "cancel_reply_contradicted"
    op.refresh_from_db()
    assert op.state == State.CANCEL_REQUESTED and not op.terminal_status
    assert op.next_poll_at is not None and op.lease_owner == ""  # due: polling decides
    poll_once(op)
    op.refresh_from_db()
    assert op.state == State.ACCEPTED and op.receipt.terminal_status == "completed"
    kinds = list(OperationEvent.objects.filter(operation=op).order_by("seq")
                 .values_list("kind", flat=True))
    assert kinds.index("cancel_reply_contradicted") < kinds.index("cancel_lost")


# What `tasks/result` returns for each terminal status (`cancelled` has nothing to fetch).
RESULTS: dict[str, dict[str, Any]] = {
    "completed": {"content": [{"type": "text", "text": "done"}]},
    "failed": {"content": [{"type": "text", "text": "tool failed"}], "isError": True},
}


@pytest.mark.parametrize("cell", cells_for(adapter=SHAPE_A, position="result"), ids=cell_id)
def test_result(server: ToolServer, cell: Cell) -> None:
    script: dict[str, Any] = {"create": "working", "get": [cell.status]}
    if cell.status in RESULTS:
        # The first read fails, so the result is read by a later poll of a FETCHING_RESULT row.
        script.update(result=RESULTS[cell.status], result_errors=1)
    op = _submit(script, node=f"result-{cell.status}")
    poll_once(op)
    op.refresh_from_db()
    if cell.status in RESULTS:
        assert op.state == State.FETCHING_RESULT and not op.result_digest, op.state
        poll_once(op)
        op.refresh_from_db()
    check_cell(op, cell)
    assert op.receipt.terminal_status == cell.status
    if cell.status in RESULTS:
        # What the server returned is what was accepted (its task `_meta` aside).
        payload = {k: v for k, v in op.result["payload"].items() if k != "_meta"}
        assert payload == RESULTS[cell.status] and op.result["kind"] == "result"
        assert op.result["is_error"] is (cell.status == "failed")
    else:
        assert op.result["kind"] == "none"


@pytest.mark.parametrize("cell", cells_for(adapter=SHAPE_A, position="notification"), ids=cell_id)
def test_notification(server: ToolServer, cell: Cell) -> None:
    """A status push about one task, read on another task's `tasks/get` stream, only makes the
    pushed task's row due now: no event, no state, no server status written from it."""
    target = _submit({"create": "working", "get": ["working"]}, node=f"push-target-{cell.status}")
    later = timezone.now() + timedelta(minutes=5)
    Operation.objects.filter(id=target.id).update(next_poll_at=later)
    events_before = OperationEvent.objects.filter(operation=target).count()
    carrier = _submit({"create": "working", "get": ["working"], "notify": {
        "taskId": target.remote_id, "status": wire_status(cell.status),
        "createdAt": "2026-01-01T00:00:00Z", "lastUpdatedAt": "2026-01-01T00:00:00Z", "ttl": 60_000,
    }}, node=f"push-carrier-{cell.status}")
    poll_once(carrier)
    target.refresh_from_db()
    assert target.next_poll_at is not None and target.next_poll_at <= timezone.now(), cell
    assert target.state == cell.from_state and target.server_state == "working"
    assert OperationEvent.objects.filter(operation=target).count() == events_before


@pytest.mark.parametrize("cell", cells_for(adapter=SHAPE_A, position="lookup_by_key"), ids=cell_id)
def test_lookup_by_key(server: ToolServer, cell: Cell) -> None:
    """The create reply is lost; the server's fencing key lookup finds the task, whatever its
    status: WORKING, and the `get` that follows decides from there."""
    op = _submit({"create": cell.status, "get": [cell.status], "lose_create": True},
                 node=f"lookup-{cell.status}")
    assert op.state == State.SUBMISSION_UNKNOWN and not op.remote_id
    poll_once(op)
    op.refresh_from_db()
    check_cell(op, cell)
    found = STATE.by_key(op.submission_key)
    assert found is not None and op.remote_id == found.task_id


@pytest.fixture
def nokey_server(status_url: str) -> ToolServer:
    """The same server without a key lookup: only `tasks/list` candidates, for an operator."""
    STATE.reset()  # the list then holds only this test's task
    return server_add(name="status-nokey", url=f"{status_url}-nokey", max_qps=50)


@pytest.mark.parametrize("cell", cells_for(adapter=SHAPE_A, position="list"), ids=cell_id)
def test_list(nokey_server: ToolServer, cell: Cell) -> None:
    op = operation_submit(server_name="status-nokey", tool_name="scripted", call_node_id="list",
                          arguments={"script": {"create": wire_status(cell.status), "lose_create": True}},
                          ttl_ms=60_000)
    assert op.state == State.SUBMISSION_UNKNOWN
    poll_once(op)
    op.refresh_from_db()
    check_cell(op, cell)
    event = OperationEvent.objects.get(operation=op, kind=cell.event)
    task = STATE.by_key(op.submission_key)
    assert task is not None
    if cell.violation:
        # The list could not be read: no candidate, the reason recorded.
        assert event.data["candidates"] == [{
            "scan_error": "tasks/list result does not match the 2025-11-25 schema",
            "type": "ProtocolViolationError"}], event.data
    else:
        # The listed task is a candidate with the status it was listed in, never the row's task.
        assert {"remote_id": task.task_id, "status": cell.status,
                "created_at": task.created} in event.data["candidates"], event.data
        assert not op.remote_id
