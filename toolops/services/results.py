"""Fetch, verify and digest the result, then hand it to the one acceptance point.

When the result comes back in the cycle that saw the terminal status, the terminal answer, the
stored result, the receipt and the outbox row are written in ONE durable transaction (after the
fetch, never around it): a crash before it leaves the row as it was, under a lease that expires,
and the next claim sees the same terminal status again. Nothing is stored that acceptance could
then fail to follow in a second transaction.

`completed` and `failed` are never accepted on the strength of a status alone: the result is
fetched (`tasks/result` or the synchronous answer), checked to belong to this task and to be
whole, stored and digested first. A lost or truncated fetch leaves the row in FETCHING_RESULT.
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from adapters import AdapterError, NotFoundError
from adapters.base import FetchedResult, RemoteTask
from ledger.digests import canonical_digest
from ledger.errors import AcceptanceRefused, IllegalTransition
from ledger.models import Operation
from ledger.selectors.rows import operation_load
from ledger.services.acceptance import operation_accept_terminal_within
from ledger.services.events import EventSpec, operation_record_event
from ledger.services.schedule import RELEASE, schedule_cleared, schedule_now
from ledger.services.shadow import operation_accept_shadow_terminal
from ledger.services.transitions import (
    Hop,
    operation_transition,
    operation_transition_path,
    operation_update_guarded,
)
from ledger.states import State, TerminalStatus
from toolops.logging import operation_log_context_for
from toolops.services.connections import RateLimited, server_call
from toolops.services.output_checks import DefenseVerdict, result_defend
from toolops.services.output_defense import operation_defend_result
from toolops.services.reconcile import operation_to_reconciliation
from toolops.services.resolution import operation_classify_missing
from toolops.services.schedule import operation_reschedule_after_error, operation_reschedule_rate_limited


class ResultRejected(Exception):
    """The fetched result does not fit the observed terminal status."""


def _stored_result(*, status: str, fetched: FetchedResult | None, status_message: str) -> dict[str, Any]:
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


def _known(op: Operation) -> dict[str, Any]:
    return {"cancel_generation": op.cancel_generation, "server_state": op.server_state}


def operation_record_terminal_seen(
    *, operation_id: uuid.UUID, from_state: State, lease_owner: str, task: RemoteTask,
    remote_id: str | None = None, observation_seq: int | None = None, op: Operation | None = None,
) -> None:
    """Record a terminal status from the server. Keeps the lease: fetching follows at once.

    `op`, when the caller holds the row already, saves the read and is updated in memory.
    """
    if task.status not in TerminalStatus.values:
        # Only a terminal status may become `terminal_status`: what is recorded here is what the
        # receipt will carry. The callers branch on the status first; this is the backstop.
        raise ValueError(f"not a terminal status: {task.status!r}")
    if op is None:
        op = Operation.objects.get(id=operation_id)
    updates: dict[str, Any] = {
        "terminal_status": task.status,
        "server_state": task.status,
        "server_status_message": task.status_message or "",
        "poll_interval_ms": task.poll_interval_ms,
        # Due at once if this worker dies now: the next claimer continues with the fetch.
        **schedule_now(release=False),
    }
    if remote_id is not None:
        updates["remote_id"] = remote_id
    if observation_seq is not None:
        updates["observation_seq"] = observation_seq
    operation_transition(
        operation_id=operation_id, from_state=from_state, to_state=State.TERMINAL_OBSERVED,
        execution_epoch=op.execution_epoch, lease_owner=lease_owner, updates=updates,
        event_kind="terminal_observed",
        event_data={"status": task.status, "status_message": task.status_message,
                    "observation_seq": observation_seq},
        known=_known(op),
    )
    _apply(op, {**updates, "state": State.TERMINAL_OBSERVED})


def _apply(op: Operation, fields: dict[str, Any]) -> None:
    for name, value in fields.items():
        setattr(op, name, value)


def _accept_in_transaction(*, op: Operation) -> str:
    """Acceptance (or the shadow's record) for the row `op` describes, in the caller's transaction."""
    if op.shadow:
        return _accept_shadow(op=op)
    try:
        receipt = operation_accept_terminal_within(
            operation_id=op.id, call_node_id=op.call_node_id, request_digest=op.request_digest,
            remote_id=op.remote_id, descriptor_version=op.descriptor_version,
            execution_epoch=op.execution_epoch, cancel_generation=op.cancel_generation,
            terminal_status=op.terminal_status, result_digest=op.result_digest,
        )
    except AcceptanceRefused:
        return "acceptance_refused"
    return f"accepted:{receipt.terminal_status}"


def _accept_shadow(*, op: Operation) -> str:
    """A shadow row's own terminal record: a comparison, never a receipt or outbox row."""
    try:
        comparison = operation_accept_shadow_terminal(
            operation_id=op.id, execution_epoch=op.execution_epoch,
            cancel_generation=op.cancel_generation, terminal_status=op.terminal_status,
            result_digest=op.result_digest, within=True,
        )
    except AcceptanceRefused as exc:
        operation_record_event(operation_id=op.id, kind="acceptance_refused",
                               data={"reason": exc.reason, "field": exc.field, "shadow": True})
        return "acceptance_refused"
    return f"shadow_accepted:{comparison.verdict}"


def _store_result(*, op: Operation, lease_owner: str, stored: dict[str, Any],
                  terminal_status: str) -> bool:
    digest = canonical_digest(stored)
    # Stays due (under our lease) until acceptance clears it: should acceptance be refused or the
    # transaction's later writes fail, the row is re-claimed when the lease runs out, never stranded.
    updates = {"result": stored, "result_kind": stored["kind"], "result_digest": digest,
               "terminal_status": terminal_status, **schedule_now(release=False)}
    ok = operation_update_guarded(
        operation_id=op.id, state=State.FETCHING_RESULT, execution_epoch=op.execution_epoch,
        cancel_generation=op.cancel_generation, lease_owner=lease_owner, updates=updates,
        event_kind="result_fetched",
        event_data={"result_digest": digest, "kind": stored["kind"],
                    "is_error": stored["is_error"]},
        known=_known(op),
    )
    if ok:
        _apply(op, updates)
    return ok


def _to_fetching(*, op: Operation, lease_owner: str) -> None:
    """TERMINAL_OBSERVED -> FETCHING_RESULT (in the caller's transaction)."""
    operation_transition(
        operation_id=op.id, from_state=State.TERMINAL_OBSERVED, to_state=State.FETCHING_RESULT,
        execution_epoch=op.execution_epoch, lease_owner=lease_owner,
        event_kind="fetching_result", known=_known(op),
    )
    op.state = State.FETCHING_RESULT


def _record_seen_locked(*, op: Operation, lease_owner: str, seen: _Seen | None) -> None:
    """The terminal status just seen (if not yet recorded), and FETCHING_RESULT."""
    if seen is not None:
        operation_record_terminal_seen(
            operation_id=op.id, from_state=seen.from_state, lease_owner=lease_owner,
            task=seen.task, remote_id=seen.remote_id, observation_seq=seen.observation_seq, op=op,
        )
    if op.state == State.TERMINAL_OBSERVED:
        _to_fetching(op=op, lease_owner=lease_owner)


def _fetch(*, op: Operation, lease_owner: str, seen: _Seen | None) -> tuple[FetchedResult | None, str | None]:
    """The result over the wire (nothing for `cancelled`), writing nothing; or, when the fetch
    fails, the status recorded (a lost or truncated fetch leaves the row in FETCHING_RESULT) and
    then the failure, as an outcome label."""
    if op.terminal_status == TerminalStatus.CANCELLED:
        return None, None  # nothing to fetch for cancelled (mcp-tasks.md section 5 point 4)
    error: AdapterError | RateLimited
    try:
        return server_call(
            server=op.server, purpose="result",
            # The status is terminal: the result is one read, bounded like any other request.
            fn=lambda adapter: adapter.fetch_result(
                remote_id=op.remote_id, timeout_s=float(settings.TOOLOPS_REQUEST_DEADLINE_SECONDS)),
            follow_up=True,
        ), None
    except RateLimited as limited:
        error = limited
    except AdapterError as exc:
        error = exc
    with transaction.atomic(durable=True):
        _record_seen_locked(op=op, lease_owner=lease_owner, seen=seen)
    if isinstance(error, RateLimited):
        if not operation_reschedule_rate_limited(op=op, lease_owner=lease_owner, limited=error):
            return None, "stale"
        return None, "rate_limited"
    if isinstance(error, NotFoundError):
        # No digest yet, so this classifies UNKNOWN: a status without its result is never accepted.
        operation_classify_missing(op=op, lease_owner=lease_owner, cause="result_not_found",
                                   error=error)
        return None, "result_not_found"
    if not operation_reschedule_after_error(op=op, lease_owner=lease_owner, error=error,
                                            kind="result_fetch_error"):
        return None, "stale"
    return None, "result_fetch_error"


def _store_and_accept_locked(*, op: Operation, lease_owner: str, fetched: FetchedResult | None,
                             verdict: DefenseVerdict | None = None) -> str:
    """Inside the durable transaction: the stored and defended result, then acceptance."""
    if op.state != State.FETCHING_RESULT:
        return "not_fetchable"
    if not op.result_digest:
        try:
            stored = _stored_result(
                status=op.terminal_status, fetched=fetched, status_message=op.server_status_message
            )
        except ResultRejected as exc:
            operation_to_reconciliation(op=op, lease_owner=lease_owner, reason="result_rejected",
                                        evidence={"error": str(exc)})
            return "result_rejected"
        # Tool output defense: a result that fails is never accepted as a success.
        defended = operation_defend_result(op=op, lease_owner=lease_owner, stored=stored,
                                           terminal_status=op.terminal_status, verdict=verdict)
        if defended is None:
            return "output_rejected"
        stored, status = defended
        if not _store_result(op=op, lease_owner=lease_owner, stored=stored, terminal_status=status):
            return "stale_lease"
    return _accept_in_transaction(op=op)


@dataclass(frozen=True)
class _Seen:
    """A terminal status just seen and not yet recorded."""

    task: RemoteTask
    from_state: State
    observation_seq: int | None = None
    remote_id: str | None = None


def operation_settle_terminal(
    *, op: Operation, lease_owner: str, task: RemoteTask | None, from_state: State | None = None,
    observation_seq: int | None = None, remote_id: str | None = None,
) -> str:
    """From a terminal status to the receipt, for a row this worker holds (loaded as `op`).

    `task` is a terminal status just seen from `from_state` and not yet recorded, or None when the
    row already records it (TERMINAL_OBSERVED, FETCHING_RESULT). The fetch comes first and writes
    nothing; then one durable transaction records the status, the result, the receipt and the
    outbox row. Raises IllegalTransition when recording the status is refused (the caller decides
    why: a moved epoch, a cancel that won).
    """
    seen = None
    if task is not None:
        assert from_state is not None
        seen = _Seen(task=task, from_state=from_state, observation_seq=observation_seq,
                     remote_id=remote_id)
        # What the fetch needs; the row gets the same values in the transaction below.
        op.terminal_status = task.status
        if remote_id is not None:
            op.remote_id = remote_id
    elif op.state not in (State.TERMINAL_OBSERVED, State.FETCHING_RESULT):
        return "not_fetchable"
    fetched: FetchedResult | None = None
    if not op.result_digest:
        fetched, failed = _fetch(op=op, lease_owner=lease_owner, seen=seen)
        if failed is not None:
            return failed
    before = copy.copy(op)  # the one write below mutates `op`; a rolled-back try starts over
    try:
        with transaction.atomic(durable=True):
            verdict = None
            if seen is not None and not op.result_digest and not op.shadow:
                settled, verdict = _settle_in_one_write(op=op, lease_owner=lease_owner, seen=seen,
                                                        fetched=fetched)
                if settled is not None:
                    return settled
            _record_seen_locked(op=op, lease_owner=lease_owner, seen=seen)
            return _store_and_accept_locked(op=op, lease_owner=lease_owner, fetched=fetched,
                                            verdict=verdict)
    except _OneWriteRefused:
        # Acceptance refused what the one write had already made final: that transaction is
        # rolled back whole, and the step-by-step path records the status, the result and why
        # acceptance refuses (it asks the acceptance point again, which records the refusal).
        op = before
        with transaction.atomic(durable=True):
            _record_seen_locked(op=op, lease_owner=lease_owner, seen=seen)
            return _store_and_accept_locked(op=op, lease_owner=lease_owner, fetched=fetched)


class _OneWriteRefused(Exception):
    """Acceptance refused a row the one write had already moved to its final state."""


# Read back from the row by the one write of the common cycle, under the lock that write takes:
# acceptance checks the claim against these, as it would against a select_for_update.
_LOCKED_FIELDS = ("call_node_id", "request_digest", "remote_id", "descriptor_version",
                  "execution_epoch", "tenant", "shadow", "input_round", "terminal_status",
                  "result_digest", "result_kind")


def _settle_in_one_write(*, op: Operation, lease_owner: str, seen: _Seen,
                         fetched: FetchedResult | None) -> tuple[str | None, DefenseVerdict | None]:
    """The common cycle (a terminal status just seen, its result fetched and clean): the status,
    the result and the final state in one guarded UPDATE (one new version of the wide row, not
    two), then acceptance against the values that UPDATE read back, which writes the receipt with
    its outbox row (one statement), then the three events of the way there and the `accepted`
    event in one INSERT. The same rows and events as the step-by-step path, in three statements
    (the guarded UPDATE, the receipt with its outbox row, the events). (None, verdict) hands
    anything else (a result that does not fit the status, or that the defense rejects) to the
    step-by-step path, which records why; a refused acceptance raises _OneWriteRefused, so that
    the caller rolls the final state back and records the refusal step by step.
    """
    task = seen.task
    try:
        stored = _stored_result(status=task.status, fetched=fetched,
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
        # Final: no next poll and no lease (acceptance follows in this transaction, or it rolls
        # back whole).
        **schedule_cleared(),
    }
    if seen.remote_id is not None:
        updates["remote_id"] = seen.remote_id
    if seen.observation_seq is not None:
        updates["observation_seq"] = seen.observation_seq
    # The hops' events are written by acceptance, with `accepted`, in one INSERT.
    hop_events: list[EventSpec] = []
    locked = operation_transition_path(
        operation_id=op.id, from_state=seen.from_state, execution_epoch=op.execution_epoch,
        lease_owner=lease_owner, updates=updates, returning=_LOCKED_FIELDS, events_out=hop_events,
        hops=[
            Hop(to_state=State.TERMINAL_OBSERVED, event_kind="terminal_observed",
                event_data={"status": task.status, "status_message": task.status_message,
                            "observation_seq": seen.observation_seq}),
            Hop(to_state=State.FETCHING_RESULT, event_kind="fetching_result"),
            Hop(to_state=State.FETCHING_RESULT, event_kind="result_fetched",
                event_data={"result_digest": digest, "kind": stored["kind"],
                            "is_error": stored["is_error"]}),
            # Acceptance writes this move's event: it names the receipt inserted below.
            Hop(to_state=State.ACCEPTED, event_kind=None),
        ],
    )
    # The claim is what this worker loaded and computed, taken before `op` becomes the locked row
    # (what the UPDATE found), against which acceptance checks it.
    call_node_id, request_digest = op.call_node_id, op.request_digest
    remote_id = seen.remote_id if seen.remote_id is not None else op.remote_id
    descriptor_version, execution_epoch = op.descriptor_version, op.execution_epoch
    cancel_generation = op.cancel_generation
    # Acceptance checks the row as it was before the final move (FETCHING_RESULT, digested).
    _apply(op, {**updates, **locked, "state": State.FETCHING_RESULT})
    try:
        receipt = operation_accept_terminal_within(
            operation_id=op.id, terminal_status=task.status, result_digest=digest, locked=op,
            call_node_id=call_node_id, request_digest=request_digest, remote_id=remote_id,
            descriptor_version=descriptor_version, execution_epoch=execution_epoch,
            cancel_generation=cancel_generation, written_final=True, events_before=hop_events,
        )
    except AcceptanceRefused as exc:
        raise _OneWriteRefused(exc.reason) from exc
    return f"accepted:{receipt.terminal_status}", None


def operation_fetch_and_accept(*, operation_id: uuid.UUID, lease_owner: str,
                               op: Operation | None = None) -> str:
    """Fetch (if not yet digested), store and accept a row that records its terminal status."""
    if op is None:
        op = operation_load(operation_id=operation_id)
        if op is None:
            return "missing"
    with operation_log_context_for(op):
        return operation_settle_terminal(op=op, lease_owner=lease_owner, task=None)


def operation_complete_sync(
    *, operation_id: uuid.UUID, lease_owner: str, result: FetchedResult, op: Operation | None = None,
) -> str:
    """A synchronous answer carries its result: observe, store and accept it in one transaction."""
    if op is None:
        op = Operation.objects.select_related("server").get(id=operation_id)
    status = "failed" if result.kind == "error" else "completed"
    with operation_log_context_for(op), transaction.atomic(durable=True):
        try:
            operation_transition(
                operation_id=op.id, from_state=State.SUBMITTING, to_state=State.TERMINAL_OBSERVED,
                execution_epoch=op.execution_epoch, lease_owner=lease_owner,
                updates={"terminal_status": status, **schedule_now(release=False)},
                event_kind="sync_result", event_data={"kind": result.kind, "is_error": result.is_error},
                known=_known(op),
            )
        except IllegalTransition:
            return "stale"
        _apply(op, {"state": State.TERMINAL_OBSERVED, "terminal_status": status})
        op.server_status_message = ""
        _to_fetching(op=op, lease_owner=lease_owner)
        outcome = _store_and_accept_locked(op=op, lease_owner=lease_owner, fetched=result)
        Operation.objects.filter(id=op.id, lease_owner=lease_owner).update(**RELEASE)
        return outcome
