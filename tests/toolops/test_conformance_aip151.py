"""AIP-151 conformance: each cell of the table, one test, against the in-repo AIP-151 server
(tests/peers/aip151_server.py, real HTTP) told to answer that way. The walk asserts the event and
the move (or stay) the table names; a violation is recorded with its reason, never a crash."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ledger.models import Operation, ToolServer
from ledger.states import State
from tests.toolops.test_conformance_mcp_tasks_2025 import _check, _ids, _poll_once
from toolops.conformance import AIP, Cell, cells_for
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
}
# Cells this server cannot be told to produce (its JSON always has a boolean `done`).
NOT_WALKED = {"done not a boolean"}


def _submit(args: dict[str, Any], node: str) -> Operation:
    return operation_submit(server_name="aip", tool_name="render", call_node_id=node,
                            arguments=args, ttl_ms=60_000)


@pytest.mark.parametrize("cell", [c for c in cells_for(adapter=AIP, position="operation_fields")
                                  if c.status not in NOT_WALKED], ids=_ids)
def test_operation_fields(aip_server: ToolServer, cell: Cell) -> None:
    op = _submit(FIELDS[cell.status], node=f"aip-{cell.status}")
    assert op.state == State.WORKING
    time.sleep(0.2)  # the short ones are done by now
    _poll_once(op)
    op.refresh_from_db()
    _check(op, cell)


@pytest.mark.parametrize("cell", cells_for(adapter=AIP, position="create_reply"), ids=_ids)
def test_create_reply(aip_server: ToolServer, cell: Cell) -> None:
    args = {**FIELDS[cell.status], **({"instant": True} if cell.status != "done:false" else {})}
    op = _submit(args, node=f"aip-create-{cell.status}")
    op.refresh_from_db()
    _check(op, cell)


@pytest.mark.parametrize("cell", cells_for(adapter=AIP, position="cancel_reply"), ids=_ids)
def test_cancel_reply(aip_server: ToolServer, cell: Cell) -> None:
    if cell.status not in ("working", "cancelled"):
        pytest.skip("AIP-151's cancel returns Empty; the adapter reads the operation after it")
    op = _submit({"seconds": 30, **({"cancelDelaySeconds": 5} if cell.status == "working" else {})},
                 node=f"aip-cancel-{cell.status}")
    operation_cancel(operation_id=op.id)
    op.refresh_from_db()
    _check(op, cell)
