"""What the per-adapter conformance walks share: a cell's test id, the status a scriptable server
is told to send for it, one claimed poll, and the check of the event and move the table names."""

from __future__ import annotations

import json

from django.utils import timezone

from ledger.models import Operation, OperationEvent
from toolops.conformance import UNKNOWN, Cell
from toolops.services.dispatch import operations_claim_due
from toolops.services.observe import operation_poll

# What the scriptable server says for the cell's "status the protocol lacks".
UNKNOWN_WIRE = "paused"


def wire_status(status: str) -> str:
    return UNKNOWN_WIRE if status == UNKNOWN else status


def poll_once(op: Operation) -> str:
    Operation.objects.filter(id=op.id).update(next_poll_at=timezone.now())
    claimed = operations_claim_due(owner="conformance")
    assert op.id in claimed
    return operation_poll(operation_id=op.id, lease_owner="conformance")


def check_cell(op: Operation, cell: Cell) -> None:
    if cell.event == "polls_count":
        # An unchanged answer is counted on the row, not written as an event.
        assert op.polls_count >= 1 and op.state == cell.from_state, f"{cell}: {op.state}"
        return
    events = list(OperationEvent.objects.filter(operation=op).order_by("seq"))
    kinds = [e.kind for e in events]
    assert cell.event in kinds, f"{cell}: events {kinds}"
    if cell.moves:
        assert any(e.from_state == cell.from_state and e.to_state == cell.to_state
                   for e in events), f"{cell}: no {cell.from_state} -> {cell.to_state} in {kinds}"
    else:
        # The observation itself moved nothing: no transition out of from_state after it.
        at = kinds.index(cell.event)
        assert all(e.from_state == e.to_state or e.from_state != cell.from_state
                   for e in events[at:]), f"{cell}: moved on: {kinds}"
    if cell.violation:
        event = events[kinds.index(cell.event)]
        assert event.data, f"{cell}: a violation is recorded with its reason"
        if cell.event != "cancel_reply_not_cancelled":  # readable, only not what 2025-11-25 says
            # Typed as a violation: the error's type, or (an unreadable create reply, which is a
            # possibly created task) the lost reply flagged as one.
            recorded = json.dumps(event.data)
            assert "ProtocolViolationError" in recorded or '"protocol_violation": true' in recorded, (
                f"{cell}: {event.data}")


def cell_id(cell: Cell) -> str:
    return f"{cell.position}:{cell.status}:{cell.from_state}"
