"""The common end of a poll cycle: a terminal status just seen, its result fetched and clean.

Two ways to write it, tried in this order by toolops.services.results:

- `cycle_settle_one_statement`: outside any transaction, one statement
  (ledger.services.acceptance_one_statement) writes the status, the result, the final state, the receipt, its
  outbox row and the events of the way there. The identity checks acceptance makes against the
  locked row are guards of that statement's UPDATE. Taken for the plainest row (task mode, no
  shadow, no input round, no cancel request, a completed or failed status): everything else,
  and anything the statement refuses, goes on to the next way, which decides and records why.
- `cycle_settle_in_transaction`: inside the caller's durable transaction, the guarded UPDATE
  reads the row back and the one acceptance point checks it and writes the receipt.

Both write the same rows and events as the step-by-step path in results.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from adapters.base import FetchedResult, RemoteTask
from ledger.digests import canonical_digest
from ledger.errors import AcceptanceRefused
from ledger.models import Operation
from ledger.services.acceptance import operation_accept_terminal_within
from ledger.services.acceptance_one_statement import operation_accept_terminal_one_statement
from ledger.services.events import EventSpec
from ledger.services.schedule import schedule_cleared
from ledger.services.terminal import operation_final_mirror
from ledger.services.transitions import Hop, operation_path_checked, operation_transition_path
from ledger.states import State, TerminalStatus
from toolops.services.output_checks import DefenseVerdict, result_defend


class ResultRejected(Exception):
    """The fetched result does not fit the observed terminal status."""


class OneWriteRefused(Exception):
    """Acceptance refused a row the one write had already moved to its final state."""


@dataclass(frozen=True)
class Seen:
    """A terminal status just seen and not yet recorded."""

    task: RemoteTask
    from_state: State
    observation_seq: int | None = None
    remote_id: str | None = None


def result_stored(*, status: str, fetched: FetchedResult | None, status_message: str) -> dict[str, Any]:
    """The result as the ledger stores it, or ResultRejected when it does not fit `status`."""
    if fetched is None:
        # Only `cancelled` has nothing to fetch; a completed or failed status without its fetched
        # result must never be stored (and so never accepted), whatever the caller's control flow.
        if status != "cancelled":
            raise ResultRejected(f"status {status} but no result was fetched")
        return {"kind": "none", "payload": None, "is_error": False, "status_message": status_message}
    if status == "completed" and fetched.kind != "result":
        raise ResultRejected(f"status completed but the result is {fetched.kind!r}")
    return {
        "kind": fetched.kind,
        "payload": fetched.payload,
        "is_error": fetched.is_error,
        "status_message": status_message,
    }


def row_apply(op: Operation, fields: dict[str, Any]) -> None:
    """The in-memory row takes what a write stored."""
    for name, value in fields.items():
        setattr(op, name, value)


@dataclass(frozen=True)
class CyclePlan:
    """What the common cycle writes: the row's fields and the hops of its way to ACCEPTED."""

    updates: dict[str, Any]
    hops: list[Hop]
    digest: str


def cycle_plan(*, op: Operation, seen: Seen,
               fetched: FetchedResult | None) -> tuple[CyclePlan | None, DefenseVerdict | None]:
    """The write, made once for both ways; or (None, verdict) for a result that does not fit
    the status (None) or that the defense rejects (its verdict): the step-by-step path records
    why."""
    task = seen.task
    try:
        stored = result_stored(status=task.status, fetched=fetched,
                               status_message=task.status_message or "")
    except ResultRejected:
        return None, None
    verdict = result_defend(op=op, stored=stored, terminal_status=task.status)
    if not verdict.ok:
        return None, verdict
    digest = canonical_digest(stored)
    updates: dict[str, Any] = {
        # The result first, as in the step-by-step store: the statement reads as the result store
        # (the fleet's database-cut test aims at it by its text).
        "result": stored, "result_kind": stored["kind"], "result_digest": digest,
        "terminal_status": task.status, "server_state": task.status,
        "server_status_message": task.status_message or "", "poll_interval_ms": task.poll_interval_ms,
        # Final: no next poll and no lease (acceptance follows in the same write or transaction).
        **schedule_cleared(),
    }
    if seen.remote_id is not None:
        updates["remote_id"] = seen.remote_id
    if seen.observation_seq is not None:
        updates["observation_seq"] = seen.observation_seq
    hops = [
        Hop(to_state=State.TERMINAL_OBSERVED, event_kind="terminal_observed",
            event_data={"status": task.status, "status_message": task.status_message,
                        "observation_seq": seen.observation_seq}),
        Hop(to_state=State.FETCHING_RESULT, event_kind="fetching_result"),
        Hop(to_state=State.FETCHING_RESULT, event_kind="result_fetched",
            event_data={"result_digest": digest, "kind": stored["kind"],
                        "is_error": stored["is_error"]}),
        # Acceptance writes this move's event: it names the receipt.
        Hop(to_state=State.ACCEPTED, event_kind=None),
    ]
    return CyclePlan(updates=updates, hops=hops, digest=digest), None


def cycle_settle_one_statement(*, op: Operation, lease_owner: str, seen: Seen,
                               plan: CyclePlan) -> str | None:
    """The common cycle in one statement, outside any transaction: the outcome label, or None
    when nothing was written (the row is not the plainest kind, or the statement refused: a
    guard, a taken receipt slot, a missed event)."""
    task = seen.task
    if (op.shadow or op.input_round or op.execution_mode == "sync" or op.cancel_generation
            or op.result_digest or task.status == TerminalStatus.CANCELLED):
        # A cancel request adds its figures to `accepted`, a round is withdrawn, a shadow or a
        # synchronous call is compared: acceptance's own steps, taken in the transaction.
        return None
    final_state, events = operation_path_checked(from_state=seen.from_state, hops=plan.hops)
    events.append(EventSpec(kind="accepted", from_state=State.FETCHING_RESULT, to_state=final_state,
                            data={"terminal_status": task.status}))
    fields = {**plan.updates, "state": final_state, "updated_at": timezone.now()}
    # The claim is what this worker loaded; the ledger holds the row to it in the statement.
    receipt_id = operation_accept_terminal_one_statement(
        operation_id=op.id, from_state=seen.from_state, lease_owner=lease_owner,
        execution_epoch=op.execution_epoch, cancel_generation=op.cancel_generation,
        call_node_id=op.call_node_id, request_digest=op.request_digest, remote_id=op.remote_id,
        descriptor_version=op.descriptor_version, execution_mode=op.execution_mode,
        fields=fields, events=events, accepted_data={})
    if receipt_id is None:
        return None
    row_apply(op, plan.updates)
    operation_final_mirror(op=op, final_state=final_state, terminal_status=task.status)
    return f"accepted:{task.status}"


# Read back from the row by the one write of the common cycle, under the lock that write takes:
# acceptance checks the claim against these, as it would against a select_for_update.
_LOCKED_FIELDS = ("call_node_id", "request_digest", "remote_id", "descriptor_version",
                  "execution_epoch", "tenant", "shadow", "input_round", "terminal_status",
                  "result_digest", "result_kind")


def cycle_settle_in_transaction(*, op: Operation, lease_owner: str, seen: Seen,
                                plan: CyclePlan) -> str:
    """The common cycle inside the caller's transaction: the status, the result and the final
    state in one guarded UPDATE (one new version of the wide row, not two), then acceptance
    against the values that UPDATE read back, which writes the receipt with its outbox row, the
    three events of the way there and the `accepted` event in one statement. Raises
    IllegalTransition when the UPDATE matches nothing, and OneWriteRefused when acceptance
    refuses, so that the caller rolls the final state back and records the refusal step by step.
    """
    task = seen.task
    # The hops' events are written by acceptance, with `accepted`, in one INSERT.
    hop_events: list[EventSpec] = []
    locked = operation_transition_path(
        operation_id=op.id, from_state=seen.from_state, execution_epoch=op.execution_epoch,
        lease_owner=lease_owner, updates=plan.updates, returning=_LOCKED_FIELDS,
        events_out=hop_events, hops=plan.hops,
    )
    # The claim is what this worker loaded and computed, taken before `op` becomes the locked row
    # (what the UPDATE found), against which acceptance checks it.
    call_node_id, request_digest = op.call_node_id, op.request_digest
    remote_id = seen.remote_id if seen.remote_id is not None else op.remote_id
    descriptor_version, execution_epoch = op.descriptor_version, op.execution_epoch
    cancel_generation = op.cancel_generation
    # Acceptance checks the row as it was before the final move (FETCHING_RESULT, digested).
    row_apply(op, {**plan.updates, **locked, "state": State.FETCHING_RESULT})
    try:
        receipt = operation_accept_terminal_within(
            operation_id=op.id, terminal_status=task.status, result_digest=plan.digest, locked=op,
            call_node_id=call_node_id, request_digest=request_digest, remote_id=remote_id,
            descriptor_version=descriptor_version, execution_epoch=execution_epoch,
            cancel_generation=cancel_generation, written_final=True, events_before=hop_events,
        )
    except AcceptanceRefused as exc:
        raise OneWriteRefused(exc.reason) from exc
    return f"accepted:{receipt.terminal_status}"
