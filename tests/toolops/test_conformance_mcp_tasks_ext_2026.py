"""Shape B (the tasks extension) conformance: each cell of the table, one test, over real HTTP.

The cells the official extension server (FastMCP + fastmcp-tasks, tests/peers/mcp_ext_server.py)
can be made to produce are walked against it; the rest (a create reply already terminal or with
a status the protocol lacks, a cancel only acknowledged, an inline outcome missing or next to
pending input, an answered request that keeps coming back, status pushes), which no conforming
SDK server sends, against the scriptable tests/peers/status_server_ext.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from adapters import ProtocolViolationError
from adapters.mcp_tasks_ext_2026 import McpTasksExt2026Adapter
from ledger.models import Operation, OperationEvent, ToolServer
from ledger.states import State
from tests.peers.scripted_http import serving_in_thread
from tests.peers.status_server_ext import TERMINAL, serve
from tests.toolops.conformance_walk import cell_id, check_cell, poll_once, wire_status
from toolops.conformance import SHAPE_B, Cell, cells_for
from toolops.services.cancel import operation_cancel
from toolops.services.inputs import operation_answer_input
from toolops.services.servers import server_add
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db

# Which tool (and arguments) makes the real server state each status.
BY_STATUS: dict[str, tuple[str, dict[str, Any]]] = {
    "working": ("sleep_then_complete", {"seconds": 30}),
    "completed": ("sleep_then_complete", {"seconds": 0.05}),
    "completed+result": ("sleep_then_complete", {"seconds": 0.05}),
    "failed": ("sleep_then_fail", {"seconds": 0.05}),
    "failed+error": ("sleep_then_fail", {"seconds": 0.05}),
    "input_required": ("ask_input", {}),
    "input_required+inputRequests": ("ask_input", {}),
}


def _submit(status: str, node: str) -> Operation:
    tool, args = BY_STATUS[status]
    return operation_submit(server_name="ext", tool_name=tool, call_node_id=node, arguments=args,
                            ttl_ms=60_000)


def _walked(position: str) -> list[Cell]:
    return [c for c in cells_for(adapter=SHAPE_B, position=position)
            if c.from_state == State.WORKING and c.status in BY_STATUS]


def _settle(op: Operation, cell: Cell) -> None:
    if cell.status != "working":
        # The short tasks end (or ask) within a moment; poll until the server says so.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            poll_once(op)
            op.refresh_from_db()
            if op.state != State.WORKING:
                return
            time.sleep(0.2)
    else:
        poll_once(op)


@pytest.mark.parametrize("cell", _walked("get") + _walked("ext_get_inline"), ids=cell_id)
def test_get_while_working(ext_server: ToolServer, cell: Cell) -> None:
    op = _submit(cell.status, node=f"ext-{cell.position}-{cell.status}")
    assert op.state == State.WORKING
    _settle(op, cell)
    op.refresh_from_db()
    check_cell(op, cell)


@pytest.mark.parametrize("cell", [c for c in cells_for(adapter=SHAPE_B, position="cancel_reply")
                                  if c.status == "cancelled"], ids=cell_id)
def test_cancel_reply(ext_server: ToolServer, cell: Cell) -> None:
    """fastmcp-tasks answers a cancel of a running task with the task already `cancelled`."""
    op = _submit("working", node="ext-cancel")
    operation_cancel(operation_id=op.id)
    op.refresh_from_db()
    check_cell(op, cell)


# -- the cells no conforming SDK server produces: the scriptable extension server --------------

@pytest.fixture(scope="module")
def scripted_url() -> Iterator[str]:
    with serving_in_thread(serve(0)) as base:
        yield f"{base}/mcp"


@pytest.fixture
def scripted(scripted_url: str) -> ToolServer:
    return server_add(name="ext-scripted", url=scripted_url, adapter_version=SHAPE_B, max_qps=50)


def _run(script: dict[str, Any], node: str) -> Operation:
    return operation_submit(server_name="ext-scripted", tool_name="scripted", call_node_id=node,
                            arguments={"script": script}, ttl_ms=60_000)


def _cancel_pending(script: dict[str, Any], node: str) -> Operation:
    """A row in CANCEL_REQUESTED: the cancel is only acknowledged and the task reads `working`."""
    op = _run({**script, "cancel": "ack"}, node=node)
    operation_cancel(operation_id=op.id)
    op.refresh_from_db()
    assert op.state == State.CANCEL_REQUESTED, op.state
    return op


@pytest.mark.parametrize("cell", cells_for(adapter=SHAPE_B, position="create_reply"), ids=cell_id)
def test_create_reply(scripted: ToolServer, cell: Cell) -> None:
    status = wire_status(cell.status)
    op = _run({"create": status, "get": [status if status in TERMINAL else "completed"]},
              node=f"xcreate-{status}")
    op.refresh_from_db()
    check_cell(op, cell)
    if cell.status == "input_required":
        # Round 1 opens from the inline request of the create reply.
        assert op.state == State.INPUT_REQUIRED and op.remote_id and op.input_round == 1
        assert op.input_requests.get(round=1).status == "open"


@pytest.mark.parametrize("cell", [c for c in cells_for(adapter=SHAPE_B, position="get")
                                  if c.from_state == State.WORKING and c.status not in BY_STATUS],
                         ids=cell_id)
def test_get_scripted(scripted: ToolServer, cell: Cell) -> None:
    op = _run({"create": "working", "get": [wire_status(cell.status)]}, node=f"xget-{cell.status}")
    poll_once(op)
    op.refresh_from_db()
    check_cell(op, cell)


@pytest.mark.parametrize("cell", [c for c in cells_for(adapter=SHAPE_B, position="get")
                                  if c.from_state == State.CANCEL_REQUESTED], ids=cell_id)
def test_get_while_a_cancel_is_pending(scripted: ToolServer, cell: Cell) -> None:
    op = _cancel_pending({"create": "working", "get": ["working", wire_status(cell.status)]},
                         node=f"xcget-{cell.status}")
    poll_once(op)
    op.refresh_from_db()
    check_cell(op, cell)


@pytest.mark.parametrize("cell", [c for c in cells_for(adapter=SHAPE_B, position="cancel_reply")
                                  if c.status != "cancelled"], ids=cell_id)
def test_cancel_reply_scripted(scripted: ToolServer, cell: Cell) -> None:
    """The cancel is acknowledged; the read after it says what the task is now."""
    op = _run({"create": "working", "get": [wire_status(cell.status)], "cancel": "ack"},
              node=f"xcancel-{cell.status}")
    operation_cancel(operation_id=op.id)
    op.refresh_from_db()
    check_cell(op, cell)
    assert op.state == State.CANCEL_REQUESTED


INLINE: dict[str, dict[str, Any]] = {
    "completed without result": {"get": ["completed"], "outcome": "omit"},
    "failed without error": {"get": ["failed"], "outcome": "omit"},
    "input_required+inputRequests+result": {"get": ["input_required"], "outcome": "both"},
}


@pytest.mark.parametrize("cell", [c for c in cells_for(adapter=SHAPE_B, position="ext_get_inline")
                                  if c.status in INLINE], ids=cell_id)
def test_inline_violation(scripted: ToolServer, cell: Cell) -> None:
    op = _run({"create": "working", **INLINE[cell.status]}, node=f"xinline-{cell.status}")
    poll_once(op)
    op.refresh_from_db()
    check_cell(op, cell)
    assert op.state == State.WORKING and not op.input_requests.exists()


@pytest.mark.parametrize("cell", [c for c in cells_for(adapter=SHAPE_B, position="ext_get_inline")
                                  if c.status == "input_required+answered key"], ids=cell_id)
def test_answered_key_comes_back(scripted: ToolServer, cell: Cell) -> None:
    """Round 1 answered; the server keeps listing its key: no second round, the row waits."""
    op = _run({"create": "working", "get": ["input_required"], "sticky_input": True},
              node="xsticky")
    poll_once(op)
    op.refresh_from_db()
    assert op.state == State.INPUT_REQUIRED
    ir = op.input_requests.get(round=1)
    assert operation_answer_input(operation_id=op.id, input_round=1, schema_digest=ir.schema_digest,
                                  response={"value": "x"}) == "delivered"
    op.refresh_from_db()
    assert op.state == State.WORKING
    poll_once(op)
    op.refresh_from_db()
    check_cell(op, cell)
    assert op.input_requests.count() == 1


RESULT: dict[str, dict[str, Any]] = {
    "completed": {"result": {"content": [{"type": "text", "text": "done"}], "isError": True}},
    "failed": {"error": {"code": -32000, "message": "tool failed"}},
}


@pytest.mark.parametrize("cell", cells_for(adapter=SHAPE_B, position="result"), ids=cell_id)
def test_result(scripted: ToolServer, cell: Cell) -> None:
    """The inline outcome is the result read; `isError: true` is still a completed task here."""
    op = _run({"create": "working", "get": [cell.status], **RESULT.get(cell.status, {})},
              node=f"xresult-{cell.status}")
    poll_once(op)
    op.refresh_from_db()
    check_cell(op, cell)
    assert op.receipt.terminal_status == cell.status
    if cell.status == "completed":
        assert op.result["kind"] == "result" and op.result["payload"] == RESULT["completed"]["result"]
    elif cell.status == "failed":
        assert op.result["kind"] == "error" and op.result["payload"] == RESULT["failed"]["error"]
    else:
        assert op.result["kind"] == "none"


@pytest.mark.parametrize("cell", cells_for(adapter=SHAPE_B, position="notification"), ids=cell_id)
def test_notification(scripted: ToolServer, cell: Cell) -> None:
    """A status push about one task, read on another task's `tasks/get`, only makes the pushed
    task's row due now: no event, no state, no server status written from it."""
    target = _run({"create": "working", "get": ["working"]}, node=f"xpush-target-{cell.status}")
    Operation.objects.filter(id=target.id).update(next_poll_at=timezone.now() + timedelta(minutes=5))
    events_before = OperationEvent.objects.filter(operation=target).count()
    carrier = _run({"create": "working", "get": ["working"], "notify": {
        "taskId": target.remote_id, "status": wire_status(cell.status)}}, node=f"xpush-{cell.status}")
    poll_once(carrier)
    target.refresh_from_db()
    assert target.next_poll_at is not None and target.next_poll_at <= timezone.now(), cell
    assert target.state == cell.from_state and target.server_state == "working"
    assert OperationEvent.objects.filter(operation=target).count() == events_before


@pytest.mark.parametrize("script", [
    {"get": ["input_required"], "outcome": "both"},
    {"get": ["input_required"], "outcome": "both_error"},
    {"get": ["completed"], "outcome": "inputs"},
], ids=["input_required+result", "input_required+error", "completed+inputRequests"])
def test_input_requests_and_an_outcome_at_once_is_a_violation(scripted_url: str,
                                                             script: dict[str, Any]) -> None:
    """At the adapter, over HTTP: every mix of pending input and an outcome is refused alike."""
    with McpTasksExt2026Adapter(url=scripted_url) as adapter:
        adapter.negotiate()
        created = adapter.submit(tool="scripted", arguments={"script": {"create": "working", **script}},
                                 ttl_ms=None, submission_key="mix")
        assert created.task is not None
        with pytest.raises(ProtocolViolationError, match="input requests and an outcome"):
            adapter.get(remote_id=created.task.remote_id)
