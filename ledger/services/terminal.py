"""What acceptance and the shadow record share: the identity checks, the choice of the final
state, and the one guarded write of it.

Both settle a row under its lock (select_for_update in a durable transaction), so the final state
goes through `operation_transition` like every other state change: the state table, and an UPDATE
whose row count is checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.utils import timezone

from ledger.errors import AcceptanceRefused
from ledger.models import Operation
from ledger.services.events import EventSpec, event_append_many_locked
from ledger.services.schedule import schedule_cleared
from ledger.services.transitions import operation_transition
from ledger.states import State, TerminalStatus


def claim_check(field: str, expected: Any, claimed: Any) -> None:
    if expected != claimed:
        raise AcceptanceRefused(
            f"{field} mismatch: ledger has {expected!r}, claim has {claimed!r}", field=field
        )


def final_state_for(*, op: Operation, terminal_status: str) -> State:
    """A confirmed cancel is accepted straight from CANCEL_REQUESTED; everything else only after
    the result was fetched and digested (FETCHING_RESULT with a stored digest). Only a terminal
    status is ever accepted: a receipt says how the call ended."""
    if terminal_status not in TerminalStatus.values:
        raise AcceptanceRefused(f"{terminal_status!r} is not a terminal status", field="terminal_status")
    if op.state == State.CANCEL_REQUESTED and terminal_status == TerminalStatus.CANCELLED:
        return State.CANCELLED_ACCEPTED
    if op.state == State.FETCHING_RESULT:
        claim_check("terminal_status", op.terminal_status, terminal_status)
        if not op.result_digest:
            raise AcceptanceRefused("result was not fetched and digested", field="result_digest")
        return State.ACCEPTED
    raise AcceptanceRefused(f"state {op.state} cannot be accepted", field="state")


def operation_finalize_locked(
    *, op: Operation, final_state: State, terminal_status: str, event_kind: str,
    event_data: Mapping[str, Any],
) -> None:
    """Write the final state of a locked row (guarded; a mismatch raises IllegalTransition)."""
    operation_transition(
        operation_id=op.id, from_state=op.state, to_state=final_state,
        execution_epoch=op.execution_epoch, cancel_generation=op.cancel_generation,
        updates={"terminal_status": terminal_status, **schedule_cleared()},
        event_kind=event_kind, event_data=event_data,
        known={"cancel_generation": op.cancel_generation, "server_state": op.server_state},
    )
    operation_final_mirror(op=op, final_state=final_state, terminal_status=terminal_status)


def operation_finalized_event_locked(
    *, op: Operation, final_state: State, terminal_status: str, event_kind: str,
    event_data: Mapping[str, Any], before: Sequence[EventSpec] = (),
) -> None:
    """The event of a final state the caller's guarded UPDATE already wrote in this transaction
    (its state table check included: operation_transition_path), from `op.state`; the in-memory
    row then mirrors what was written, as after operation_finalize_locked.

    `before`: the events of the way to `op.state` that the same UPDATE made and left unwritten
    (operation_transition_path's `events_out`); they go first, in the same INSERT."""
    event_append_many_locked(
        operation_id=op.id,
        events=[*before, EventSpec(kind=event_kind, from_state=op.state, to_state=final_state,
                                   data=event_data)],
        server_state=op.server_state, execution_epoch=op.execution_epoch,
        cancel_generation=op.cancel_generation,
    )
    operation_final_mirror(op=op, final_state=final_state, terminal_status=terminal_status)


def operation_final_mirror(*, op: Operation, final_state: State, terminal_status: str) -> None:
    """The in-memory row mirrors what the final write stored (for a caller that wrote the final
    state's event itself: acceptance, with its receipt)."""
    op.state = final_state
    op.terminal_status = terminal_status
    for name, value in schedule_cleared().items():
        setattr(op, name, value)
    op.updated_at = timezone.now()
