"""AIP-151 conformance: each cell of the table, one test, against the in-repo AIP-151 server
(tests/peers/aip151_server.py, real HTTP) told to answer that way. The walk asserts the event and
the move (or stay) the table names; a violation is recorded with its reason, never a crash."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ledger.models import Operation, ToolServer
from ledger.states import State
from tests.toolops.conformance_walk import cell_id, check_cell, poll_once
from toolops.conformance import AIP, UNKNOWN, Cell, cells_for
from toolops.services.cancel import operation_cancel
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db

# How the server is told to produce each cell (arguments of its `render` method).
FIELDS: dict[str, dict[str, Any]] = {
    "done:false": {"seconds": 30},
    "done:true+response": {"seconds": 0.05, "value": "v"},
    "done:true+error(code 1)": {"seconds": 0.05, "outcome": "error", "errorCode": 1},
    "done:true+error(other code)": {"seconds": 0.05, "outcome": "error", "errorCode": 13},
    "done:true, neither": {"seconds": 0.05, "outcome": "neither"},
    "done:true, both": {"seconds": 0.05, "outcome": "both"},
    "done not a boolean": {"seconds": 0.05, "outcome": "done_string"},
}


def _submit(args: dict[str, Any], node: str) -> Operation:
    return operation_submit(server_name="aip", tool_name="render", call_node_id=node,
                            arguments=args, ttl_ms=60_000)


@pytest.mark.parametrize("cell", cells_for(adapter=AIP, position="operation_fields"), ids=cell_id)
def test_operation_fields(aip_server: ToolServer, cell: Cell) -> None:
    op = _submit(FIELDS[cell.status], node=f"aip-{cell.status}")
    assert op.state == State.WORKING
    time.sleep(0.2)  # the short ones are done by now
    poll_once(op)
    op.refresh_from_db()
    check_cell(op, cell)


@pytest.mark.parametrize("cell", cells_for(adapter=AIP, position="create_reply"), ids=cell_id)
def test_create_reply(aip_server: ToolServer, cell: Cell) -> None:
    args = {**FIELDS[cell.status], **({"instant": True} if cell.status != "done:false" else {})}
    op = _submit(args, node=f"aip-create-{cell.status}")
    op.refresh_from_db()
    check_cell(op, cell)


# What the operation read after the (Empty) cancel reply shows, per cell: still running (the
# cancel takes effect later), cancelled, or done anyway (cancelLoses) with each outcome.
CANCEL: dict[str, dict[str, Any]] = {
    "working": {"seconds": 30, "cancelDelaySeconds": 5},
    "cancelled": {"seconds": 30},
    "completed": {"seconds": 0.05, "cancelLoses": True},
    "failed": {"seconds": 0.05, "cancelLoses": True, "outcome": "error", "errorCode": 13},
    UNKNOWN: {"seconds": 0.05, "cancelLoses": True, "outcome": "done_string"},
}


@pytest.mark.parametrize("cell", [c for c in cells_for(adapter=AIP, position="cancel_reply")
                                  if c.status in CANCEL], ids=cell_id)
def test_cancel_reply(aip_server: ToolServer, cell: Cell) -> None:
    op = _submit(CANCEL[cell.status], node=f"aip-cancel-{cell.status}")
    time.sleep(0.2)  # the short ones are done by now: the cancel lost the race
    operation_cancel(operation_id=op.id)
    op.refresh_from_db()
    check_cell(op, cell)
    assert op.state == State.CANCEL_REQUESTED or cell.status == "cancelled", op.state


# The operation fields that end the operation, per receipt status the result read gives.
RESULT: dict[str, dict[str, Any]] = {
    "completed": FIELDS["done:true+response"],
    "failed": FIELDS["done:true+error(other code)"],
    "cancelled": FIELDS["done:true+error(code 1)"],
}


@pytest.mark.parametrize("cell", cells_for(adapter=AIP, position="result"), ids=cell_id)
def test_result(aip_server: ToolServer, cell: Cell) -> None:
    """The done operation is read for its outcome (the result read) and accepted with it."""
    op = _submit(RESULT[cell.status], node=f"aip-result-{cell.status}")
    time.sleep(0.2)
    poll_once(op)
    op.refresh_from_db()
    check_cell(op, cell)
    assert op.receipt.terminal_status == cell.status
    if cell.status == "completed":
        assert op.result["kind"] == "result" and "v" in str(op.result["payload"])
    elif cell.status == "failed":
        assert op.result["kind"] == "error" and op.result["payload"]["code"] == 13
