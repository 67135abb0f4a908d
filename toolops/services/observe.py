"""Polling: one `get` per claimed row, recorded only if the lease, epoch and sequence still hold."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from adapters import (
    AdapterError,
    LostResponseError,
    NotFoundError,
    SessionLostError,
    TransientError,
)
from adapters.base import RemoteTask
from ledger.errors import IllegalTransition
from ledger.models import Operation
from ledger.selectors.rows import operation_load
from ledger.services.schedule import RELEASE, schedule_cleared, schedule_now
from ledger.services.transitions import (
    operation_transition,
    operation_update_guarded,
    operation_write_guarded,
)
from ledger.states import State, TerminalStatus
from toolops.logging import get_logger, operation_log_context_for
from toolops.scheduling import poll_deadline_reason
from toolops.services.cancel import (
    operation_observe_cancel_pending,
    operation_observe_cancel_requested,
    operation_record_late_effect,
)
from toolops.services.connections import RateLimited, server_call
from toolops.services.executors import operation_refuse_stale, worker_refused_at_start
from toolops.services.inputs import operation_open_input_round
from toolops.services.reconcile import operation_to_reconciliation
from toolops.services.resolution import operation_classify_missing, operation_resolve_submission
from toolops.services.results import operation_fetch_and_accept, operation_settle_terminal
from toolops.services.schedule import (
    lease_release_or_hold,
    operation_reschedule_after_error,
    operation_reschedule_rate_limited,
    task_schedule_fields,
)

# Re-exported for callers that import them from the poll loop; they live in schedule.py.
__all__ = ["RELEASE", "operation_poll", "operation_reschedule_after_error",
           "operation_reschedule_rate_limited", "operation_to_reconciliation", "task_schedule_fields"]

logger = logging.getLogger("toolops.poll")
poll_logger = get_logger("toolops.poll")

TERMINAL_SERVER_STATUSES = frozenset(TerminalStatus.values)


# Outcomes after which a moved epoch, not a lost race, may be the reason nothing was written.
_MAYBE_STALE = frozenset({"stale_observation", "stale_lease", "acceptance_refused", "stale"})


def operation_poll(*, operation_id: uuid.UUID, lease_owner: str,
                   hold_until: datetime | None = None, loaded: Operation | None = None) -> str:
    """Poll one leased row. Returns a short outcome label (for logs and the runner).

    A worker of an older execution epoch (a rollback moved the row to the other
    executor) is refused and the refusal recorded, whether it arrives late or is caught mid-poll.
    `hold_until`: the caller polls this row again in-process if its next poll falls before then
    (toolops.services.poll_batch), so a working answer keeps the lease instead of releasing it;
    the outcome is then `held:<next poll time, ISO 8601>` instead of `working`.
    `loaded`: the row as the caller read it for this poll, with its batch (`operations_load`),
    instead of a read here. Only its checks at the start use it: every write below is guarded in
    SQL by lease, state, epoch and sequence, so a row that moved on since that read is refused
    there exactly as one that moves on during the poll.
    """
    op = loaded if loaded is not None and loaded.id == operation_id else (
        operation_load(operation_id=operation_id))
    if op is None:
        return "missing"
    # Every log line of this poll (ours, the adapters', the services') carries the operation's
    # identity; the row is already loaded, so this costs no query.
    with operation_log_context_for(op):
        outcome = _operation_poll_checked(op=op, lease_owner=lease_owner, hold_until=hold_until)
        poll_logger.debug("operation polled", outcome=outcome, lease_owner=lease_owner)
        return outcome


def _operation_poll_checked(*, op: Operation, lease_owner: str, hold_until: datetime | None) -> str:
    operation_id = op.id
    if worker_refused_at_start(op=op, lease_owner=lease_owner):
        return "stale_epoch"
    try:
        outcome = _operation_poll(op=op, lease_owner=lease_owner, hold_until=hold_until)
    except IllegalTransition:
        if operation_refuse_stale(operation_id=operation_id, claimed_epoch=op.execution_epoch,
                                  lease_owner=lease_owner, source="poll"):
            return "stale_epoch"
        raise
    if outcome.split(":")[0] in _MAYBE_STALE and operation_refuse_stale(
        operation_id=operation_id, claimed_epoch=op.execution_epoch, lease_owner=lease_owner,
        source="poll",
    ):
        return "stale_epoch"
    return outcome


def _operation_poll(*, op: Operation, lease_owner: str, hold_until: datetime | None) -> str:
    """One poll cycle of a row loaded once (by operation_poll): no re-reads; every write below is
    one guarded UPDATE in one transaction."""
    now = timezone.now()
    if op.lease_owner != lease_owner or op.lease_expires_at is None or op.lease_expires_at <= now:
        # Our claim is gone (expired and re-claimed, or released): another worker owns the row.
        return "stale_lease"
    if op.state == State.SUBMITTING:
        # The submitter's lease ran out before it recorded an outcome: the request may have left.
        operation_transition(
            operation_id=op.id, from_state=State.SUBMITTING, to_state=State.SUBMISSION_UNKNOWN,
            execution_epoch=op.execution_epoch, lease_owner=lease_owner,
            # Due at once: the resolution pass (lookup by key) picks it up.
            updates=schedule_now(),
            event_kind="submission_unknown",
            event_data={"reason": "submitter lost before recording the outcome"},
        )
        return "submission_unknown"
    if op.state == State.SUBMISSION_UNKNOWN:
        return operation_resolve_submission(operation_id=op.id, lease_owner=lease_owner)
    if op.state in (State.TERMINAL_OBSERVED, State.FETCHING_RESULT):
        if op.expires_at is not None and now >= op.expires_at and op.result_digest:
            # Digested before expiry: the server is no longer needed, acceptance proceeds.
            operation_classify_missing(op=op, lease_owner=lease_owner, cause="expired_after_digest")
        return operation_fetch_and_accept(operation_id=op.id, lease_owner=lease_owner, op=op)
    if op.state not in (State.WORKING, State.CANCEL_REQUESTED):
        operation_update_guarded(
            operation_id=op.id, state=op.state, execution_epoch=op.execution_epoch,
            lease_owner=lease_owner, updates=schedule_cleared(),
            event_kind="poll_skipped", event_data={"reason": f"state {op.state} is not polled"},
        )
        return "not_pollable"
    reason = poll_deadline_reason(now=now, created_at=op.created_at, expires_at=op.expires_at)
    if reason is not None:
        # A recorded outcome, never a silent stop and never a cancel: no terminal state was seen
        # before our wait budget or the server's ttl ended, so the row is UNKNOWN and goes to the
        # reconciliation queue with what we last knew (the work may still finish on the server).
        operation_classify_missing(op=op, lease_owner=lease_owner, cause=reason)
        return reason

    # The sequence this poll is issued with. Every claim bumps poll_attempts under the row lock,
    # so a later claim always issues a higher number than an earlier one, and a redelivered task
    # of the same claim issues the same number (the first of the two to record wins).
    issued_seq = max(op.observation_seq + 1, op.poll_attempts)
    try:
        # In the server's line under its own id: a refused poll is told its slot, and its
        # reschedule below brings it back exactly then (toolops.qps, "the line").
        task = server_call(server=op.server, purpose="poll", holder=str(op.id),
                           fn=lambda adapter: adapter.get(remote_id=op.remote_id))
    except RateLimited as limited:
        # A write that matched nothing (the row moved on while we waited) is reported as stale,
        # so an epoch bump in the meantime is recorded as this worker's refusal.
        if not operation_reschedule_rate_limited(op=op, lease_owner=lease_owner, limited=limited):
            return "stale"
        return "rate_limited"
    except NotFoundError as exc:
        cause = "session_lost" if isinstance(exc, SessionLostError) else "not_found_unknown"
        operation_classify_missing(op=op, lease_owner=lease_owner, cause=cause, error=exc)
        return "not_found"
    except (TransientError, LostResponseError, AdapterError) as exc:
        if not operation_reschedule_after_error(op=op, lease_owner=lease_owner, error=exc,
                                                kind="poll_error"):
            return "stale"  # the answer was an error, and the row moved on while it came
        return "poll_error"

    # An older observation never overwrites a newer one: the sequence guard rejects it.
    seq_guard = {"observation_seq__lt": issued_seq}
    fields = {**task_schedule_fields(op=op, task=task, now=timezone.now()),
              "observation_seq": issued_seq, "polls_count": F("polls_count") + 1}
    data: dict[str, Any] = {"observation_seq": issued_seq, "status": task.status,
                            "status_message": task.status_message}
    if task.progress is not None:
        data["progress"] = task.progress  # AIP-151 `metadata`, verbatim, in the time series
        fields["server_progress"] = task.progress
    if task.status in TERMINAL_SERVER_STATUSES:
        if op.state == State.CANCEL_REQUESTED:
            # Which terminal state won the race with our cancel: the cancel service decides.
            return operation_observe_cancel_requested(
                op=op, lease_owner=lease_owner, task=task, observation_seq=issued_seq
            )
        try:
            # Fetch, then one transaction: status, result, receipt, outbox row.
            return operation_settle_terminal(
                op=op, lease_owner=lease_owner, task=task, from_state=State(op.state),
                observation_seq=issued_seq,
            )
        except IllegalTransition:
            latest = Operation.objects.filter(id=op.id).values_list("execution_epoch", flat=True)
            if latest.first() != op.execution_epoch:
                raise  # handed to the other executor: operation_poll records the refusal
            # A stale worker's completion after an accepted cancel is a late effect, not a state.
            late = operation_record_late_effect(
                operation_id=op.id, observed_status=task.status, source="poll",
                evidence={"observation_seq": issued_seq, "task": task.raw},
            )
            return "late_effect" if late is not None else "stale_observation"
    if op.state == State.CANCEL_REQUESTED:
        return operation_observe_cancel_pending(op=op, lease_owner=lease_owner, task=task,
                                                fields=fields, data=data, seq_guard=seq_guard)
    if task.status == "input_required" and op.state == State.WORKING:
        # Polling pauses; the pending server request becomes the next input round.
        return operation_open_input_round(op=op, lease_owner=lease_owner, task=task,
                                          fields=fields, data=data)
    return _record_working(op=op, lease_owner=lease_owner, task=task, fields=fields, data=data,
                           seq_guard=seq_guard, hold_until=hold_until)


def _record_working(*, op: Operation, lease_owner: str, task: RemoteTask, fields: dict[str, Any],
                    data: dict[str, Any], seq_guard: dict[str, Any], hold_until: datetime | None) -> str:
    """A non-terminal answer. What the server says changed (its status, message or progress) is
    an event; a poll that changes nothing is one guarded UPDATE of the schedule and the counters
    (polls_count, last_polled_at), so the event series stays bounded however long the task runs."""
    changed = (
        task.status != op.server_state
        or (task.status_message or "") != op.server_status_message
        or (task.progress is not None and task.progress != op.server_progress)
    )
    lease = lease_release_or_hold(next_poll_at=fields["next_poll_at"], hold_until=hold_until)
    if changed:
        ok = operation_update_guarded(
            operation_id=op.id, state=op.state, execution_epoch=op.execution_epoch,
            lease_owner=lease_owner, updates={**fields, **lease}, event_kind="observed",
            event_data=data, extra_filters=seq_guard,
            known={"cancel_generation": op.cancel_generation},
        )
    else:
        # Only the schedule and counters: safe to lose in a crash (the row is polled again), so
        # its commit need not wait for the WAL flush (ledger/flush.py).
        ok = operation_write_guarded(
            operation_id=op.id, state=op.state, execution_epoch=op.execution_epoch,
            lease_owner=lease_owner, updates={**fields, **lease}, extra_filters=seq_guard,
            defer_flush=bool(settings.TOOLOPS_DEFERRED_FLUSH),
        )
    if not ok:
        return "stale_observation"
    if lease is not RELEASE:
        # Kept for the caller's next in-process poll, at the time this write recorded.
        return f"held:{fields['next_poll_at'].isoformat()}"
    return "working"
