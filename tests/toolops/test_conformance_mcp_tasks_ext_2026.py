"""Shape B (the tasks extension) conformance: the cells the official extension server (FastMCP +
fastmcp-tasks, tests/peers/mcp_ext_server.py) can be made to produce, one test each, over real
HTTP; the violation cells, which no conforming SDK server produces, against a transport that
answers them verbatim (the adapter's decoding is what they test)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from adapters import ProtocolViolationError
from adapters.mcp_tasks_ext_2026 import McpTasksExt2026Adapter
from ledger.models import Operation, ToolServer
from ledger.states import State
from tests.toolops.test_conformance_mcp_tasks_2025 import _check, _ids, _poll_once
from toolops.conformance import SHAPE_B, Cell, cells_for
from toolops.services.cancel import operation_cancel
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
            _poll_once(op)
            op.refresh_from_db()
            if op.state != State.WORKING:
                return
            time.sleep(0.2)
    else:
        _poll_once(op)


@pytest.mark.parametrize("cell", _walked("get") + _walked("ext_get_inline"), ids=_ids)
def test_get_while_working(ext_server: ToolServer, cell: Cell) -> None:
    op = _submit(cell.status, node=f"ext-{cell.position}-{cell.status}")
    assert op.state == State.WORKING
    _settle(op, cell)
    op.refresh_from_db()
    _check(op, cell)


@pytest.mark.parametrize("cell", [c for c in cells_for(adapter=SHAPE_B, position="cancel_reply")
                                  if c.status == "cancelled"], ids=_ids)
def test_cancel_reply(ext_server: ToolServer, cell: Cell) -> None:
    """fastmcp-tasks answers a cancel of a running task with the task already `cancelled`."""
    op = _submit("working", node="ext-cancel")
    operation_cancel(operation_id=op.id)
    op.refresh_from_db()
    _check(op, cell)


def _task(**fields: Any) -> dict[str, Any]:
    return {"taskId": "t1", "status": "input_required", "createdAt": "2026-01-01T00:00:00Z",
            **fields}


REQUESTS = {"k1": {"method": "elicitation/create",
                   "params": {"message": "?", "requestedSchema": {"type": "object"}}}}


@pytest.mark.parametrize("task", [
    _task(inputRequests=REQUESTS, result={"content": []}),
    _task(inputRequests=REQUESTS, error={"code": 1, "message": "x"}),
    {**_task(inputRequests=REQUESTS, result={"content": []}), "status": "completed"},
], ids=["input_required+result", "input_required+error", "completed+inputRequests"])
def test_input_requests_and_an_outcome_at_once_is_a_violation(task: dict[str, Any]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": body["id"], "result": task})

    adapter = McpTasksExt2026Adapter(url="http://ext.invalid/mcp",
                                     transport=httpx.MockTransport(handler))
    with pytest.raises(ProtocolViolationError, match="input requests and an outcome"):
        adapter.get(remote_id="t1")
