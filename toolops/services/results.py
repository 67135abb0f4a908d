"""Fetch, verify and digest the result, then hand it to the one acceptance point.

When the result comes back in the cycle that saw the terminal status, the terminal answer, the
stored result, the receipt and the outbox row are written in ONE durable transaction (after the
fetch, never around it), or for the plainest row in one statement (toolops.services.settle_cycle):
a crash before it leaves the row as it was, under a lease that expires, and the next claim sees
the same terminal status again. Nothing is stored that acceptance could then fail to follow in a
second transaction.

`completed` and `failed` are never accepted on the strength of a status alone: the result is
fetched (`tasks/result` or the synchronous answer), checked to belong to this task and to be
whole, stored and digested first. A lost or truncated fetch leaves the row in FETCHING_RESULT.
"""

from __future__ import annotations

import copy
import uuid
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
from ledger.services.events import operation_record_event
from ledger.services.schedule import RELEASE, schedule_now
from ledger.services.shadow import operation_accept_shadow_terminal
from ledger.services.transitions import operation_transition, operation_update_guarded
from ledger.states import State, TerminalStatus
from toolops.logging import operation_log_context_for
from toolops.services.connections import RateLimited, server_call
from toolops.services.output_checks import DefenseVerdict
from toolops.services.output_defense import operation_defend_result
from toolops.services.reconcile import operation_to_reconciliation
from toolops.services.resolution import operation_classify_missing
from toolops.services.schedule import operation_reschedule_after_error, operation_reschedule_rate_limited
from toolops.services.settle_cycle import (
    OneWriteRefused,
    ResultRejected,
    Seen,
    cycle_plan,
    cycle_settle_in_transaction,
    cycle_settle_one_statement,
    result_stored,
    row_apply,
)


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
    row_apply(op, {**updates, "state": State.TERMINAL_OBSERVED})


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
        row_apply(op, updates)
    return ok


def _to_fetching(*, op: Operation, lease_owner: str) -> None:
    """TERMINAL_OBSERVED -> FETCHING_RESULT (in the caller's transaction)."""
    operation_transition(
        operation_id=op.id, from_state=State.TERMINAL_OBSERVED, to_state=State.FETCHING_RESULT,
        execution_epoch=op.execution_epoch, lease_owner=lease_owner,
        event_kind="fetching_result", known=_known(op),
    )
    op.state = State.FETCHING_RESULT


def _record_seen_locked(*, op: Operation, lease_owner: str, seen: Seen | None) -> None:
    """The terminal status just seen (if not yet recorded), and FETCHING_RESULT."""
    if seen is not None:
        operation_record_terminal_seen(
            operation_id=op.id, from_state=seen.from_state, lease_owner=lease_owner,
            task=seen.task, remote_id=seen.remote_id, observation_seq=seen.observation_seq, op=op,
        )
    if op.state == State.TERMINAL_OBSERVED:
        _to_fetching(op=op, lease_owner=lease_owner)


def _fetch(*, op: Operation, lease_owner: str, seen: Seen | None) -> tuple[FetchedResult | None, str | None]:
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
            stored = result_stored(
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


def operation_settle_terminal(
    *, op: Operation, lease_owner: str, task: RemoteTask | None, from_state: State | None = None,
    observation_seq: int | None = None, remote_id: str | None = None,
) -> str:
    """From a terminal status to the receipt, for a row this worker holds (loaded as `op`).

    `task` is a terminal status just seen from `from_state` and not yet recorded, or None when the
    row already records it (TERMINAL_OBSERVED, FETCHING_RESULT). The fetch comes first and writes
    nothing; then one statement (the plainest row) or one durable transaction records the
    status, the result, the receipt and the outbox row. Raises IllegalTransition when recording
    the status is refused (the caller decides why: a moved epoch, a cancel that won).
    """
    seen = None
    if task is not None:
        assert from_state is not None
        seen = Seen(task=task, from_state=from_state, observation_seq=observation_seq,
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
    plan = verdict = None
    if seen is not None and not op.result_digest and not op.shadow:
        # The common cycle's write, made once: tried in one statement for the plainest row (no
        # transaction), then in the transaction below, which decides and records why.
        plan, verdict = cycle_plan(op=op, seen=seen, fetched=fetched)
        if plan is not None:
            settled = cycle_settle_one_statement(op=op, lease_owner=lease_owner, seen=seen,
                                                 plan=plan)
            if settled is not None:
                return settled
    before = copy.copy(op)  # the one write below mutates `op`; a rolled-back try starts over
    try:
        with transaction.atomic(durable=True):
            if seen is not None and plan is not None:
                return cycle_settle_in_transaction(op=op, lease_owner=lease_owner, seen=seen,
                                                   plan=plan)
            _record_seen_locked(op=op, lease_owner=lease_owner, seen=seen)
            return _store_and_accept_locked(op=op, lease_owner=lease_owner, fetched=fetched,
                                            verdict=verdict)
    except OneWriteRefused:
        # Acceptance refused what the one write had already made final: that transaction is
        # rolled back whole, and the step-by-step path records the status, the result and why
        # acceptance refuses (it asks the acceptance point again, which records the refusal).
        op = before
        with transaction.atomic(durable=True):
            _record_seen_locked(op=op, lease_owner=lease_owner, seen=seen)
            return _store_and_accept_locked(op=op, lease_owner=lease_owner, fetched=fetched)


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
        row_apply(op, {"state": State.TERMINAL_OBSERVED, "terminal_status": status})
        op.server_status_message = ""
        _to_fetching(op=op, lease_owner=lease_owner)
        outcome = _store_and_accept_locked(op=op, lease_owner=lease_owner, fetched=result)
        Operation.objects.filter(id=op.id, lease_owner=lease_owner).update(**RELEASE)
        return outcome
