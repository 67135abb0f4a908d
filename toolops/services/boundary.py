"""The per-row error boundary and the executor loop built on it.

Whatever escapes one row's poll cycle (a bug, a database error on that row's data, an
unexpected exception from a library) is caught here, recorded on that row as an
`executor_error` event (exception type, a redacted one-line message and where it was raised;
never argument or result payloads), and the row is released and rescheduled with the same
backoff as a failed call. After `TOOLOPS_EXECUTOR_MAX_CRASHES` consecutive crashes the row goes
to the reconciliation queue with reason `executor_error`, so a poison row reaches an operator
instead of crashing every worker that claims it.

Recording can fail too (the database is away): it is retried a few times with the connection
reopened between tries, and otherwise the row is left to its lease, which the dispatcher
re-claims once it runs out (toolops.services.dispatch.claim_due_locked).

The loop (`executor_loop`) is the embedded runner's and each path executor's: one bad row never
stops it, a failing claim or schedule query only makes it nap, and it stops claiming once its
time is up, handing back the leases of claimed rows it did not get to.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from ledger.models import Operation, OperationEvent
from ledger.selectors.rows import operations_load
from ledger.services.events import event_append_locked
from ledger.services.schedule import RELEASE, schedule_at
from ledger.states import TRANSITIONS, State
from toolops.scheduling import next_poll_after_error_at
from toolops.services.db_retry import db_connection_reopen, db_write_retrying, exception_redacted
from toolops.services.dispatch import CLAIMABLE
from toolops.services.reconcile import operation_to_reconciliation

logger = logging.getLogger("toolops.boundary")

T = TypeVar("T")

EXECUTOR_ERROR = "executor_error"
ACCEPTANCE_REFUSED = "acceptance_refused"
# Events a crashing cycle may write before it crashes again (it re-fetches, re-records an error):
# they do not end a run of crashes. Any other event is progress and starts the count afresh.
NON_PROGRESS_KINDS = frozenset({EXECUTOR_ERROR, "poll_error", "result_fetch_error",
                                "fetching_result", "result_fetched", "acceptance_refused"})
CRASH_LOOKBACK_EVENTS = 32
# A claim or schedule query that failed (database away): nap this long before the next tick.
TICK_ERROR_NAP_SECONDS = 0.5
MAX_IDLE_SLEEP_SECONDS = 0.5
# The embedded loop polls its claim one row after another and reads this many rows in one
# statement ahead of their polls: the statements saved level off near the poll batch's size
# (16), while the last row's read ages by one poll per row before its poll starts.
READ_AHEAD_ROWS = 16


def _consecutive_crashes(*, operation_id: uuid.UUID) -> int:
    kinds = OperationEvent.objects.filter(operation_id=operation_id).order_by("-seq").values_list(
        "kind", flat=True)[:CRASH_LOOKBACK_EVENTS]
    count = 0
    for kind in kinds:
        if kind not in NON_PROGRESS_KINDS:
            break
        count += kind == EXECUTOR_ERROR
    return count


def _record_crash(*, operation_id: uuid.UUID, lease_owner: str, error: dict[str, Any],
                  label: str = EXECUTOR_ERROR) -> str:
    max_crashes = int(settings.TOOLOPS_EXECUTOR_MAX_CRASHES)
    with transaction.atomic():
        op = Operation.objects.select_for_update().filter(id=operation_id).first()
        if op is None:
            return "missing"
        now = timezone.now()
        lease_free = (op.lease_owner in (lease_owner, "") or op.lease_expires_at is None
                      or op.lease_expires_at <= now)
        crashes = _consecutive_crashes(operation_id=op.id) + 1
        data = {**error, "consecutive_crashes": crashes, "max_crashes": max_crashes,
                "lease_owner": lease_owner}
        if not lease_free:
            # Another worker owns the row now: record what happened, leave its schedule alone.
            _append(op=op, data={**data, "rescheduled": False})
            return label
        if op.state in CLAIMABLE:
            if crashes >= max_crashes and State.RECONCILIATION_REQUIRED in TRANSITIONS[State(op.state)]:
                _append(op=op, data={**data, "rescheduled": False})
                operation_to_reconciliation(op=op, lease_owner=None, reason=EXECUTOR_ERROR,
                                            evidence={"last_error": error, "crashes": crashes})
                return f"{label}_queued"
            at = next_poll_after_error_at(now=now, poll_interval_ms=op.poll_interval_ms,
                                          expires_at=op.expires_at, consecutive_errors=crashes,
                                          retry_after_s=None)
            Operation.objects.filter(id=op.id).update(**schedule_at(at=at), updated_at=now)
            _append(op=op, data={**data, "rescheduled": True, "retry_at": at.isoformat()})
            return label
        # Not polled in this state (waiting on input, queued, terminal): hand back our lease only.
        Operation.objects.filter(id=op.id, lease_owner=lease_owner).update(**RELEASE, updated_at=now)
        _append(op=op, data={**data, "rescheduled": False})
        return label


def _append(*, op: Operation, data: dict[str, Any]) -> None:
    event_append_locked(operation_id=op.id, kind=EXECUTOR_ERROR, from_state=op.state,
                        to_state=op.state, server_state=op.server_state,
                        execution_epoch=op.execution_epoch, cancel_generation=op.cancel_generation,
                        data=data)


def operation_record_crash(*, operation_id: uuid.UUID, lease_owner: str, exc: BaseException) -> str:
    """Record a crash of one row's cycle and reschedule (or queue) the row. Never raises."""
    error = exception_redacted(exc)
    logger.error("poll cycle of %s crashed: %s: %s (%s)", operation_id, error["type"],
                 error["message"], error["where"])
    db_connection_reopen()
    try:
        return db_write_retrying(
            lambda: _record_crash(operation_id=operation_id, lease_owner=lease_owner, error=error),
            what=f"recording the crash of {operation_id}")
    except Exception as record_exc:
        # The row keeps its lease; the dispatcher re-claims it when the lease runs out.
        logger.error("crash of %s not recorded (%s); its lease will expire", operation_id,
                     exception_redacted(record_exc)["type"])
        db_connection_reopen()
        return "executor_error_unrecorded"


def operation_poll_guarded(*, operation_id: uuid.UUID, lease_owner: str,
                           hold_until: datetime | None = None,
                           loaded: Operation | None = None) -> str:
    """`operation_poll` inside the per-row error boundary: always returns an outcome label.
    `loaded`: the row as read with its batch (`operations_load`), or None to read it here."""
    # Looked up at call time (the poll loop sits above this module, and tests replace it).
    from toolops.services.observe import operation_poll

    try:
        outcome = operation_poll(operation_id=operation_id, lease_owner=lease_owner,
                                 hold_until=hold_until, loaded=loaded)
    except Exception as exc:
        return operation_record_crash(operation_id=operation_id, lease_owner=lease_owner, exc=exc)
    if outcome != ACCEPTANCE_REFUSED:
        return outcome
    # The acceptance point refused a stored result (its reason is in the acceptance_refused
    # event). The row stays due under our lease, so it would be tried again at every lease end,
    # forever: it is counted like a crash instead (backoff, then the queue after the limit).
    try:
        return db_write_retrying(lambda: _record_crash(
            operation_id=operation_id, lease_owner=lease_owner, label=ACCEPTANCE_REFUSED,
            error={"type": ACCEPTANCE_REFUSED, "where": "",
                   "message": "the acceptance point refused this row (see acceptance_refused)"}),
            what=f"recording the refused acceptance of {operation_id}")
    except Exception:
        db_connection_reopen()  # the lease expires and the row is tried again
        return outcome


def operations_load_for_poll(*, operation_ids: list[uuid.UUID]) -> dict[uuid.UUID, Operation]:
    """The rows of a batch about to be polled, read in one statement instead of one each.
    Never raises: if the read fails, the result is empty and each poll reads its own row inside
    its own boundary, which records a failure there on that row."""
    try:
        return operations_load(operation_ids=operation_ids)
    except Exception as exc:
        logger.warning("batch read of %d rows failed, each is read by its poll: %s",
                       len(operation_ids), exception_redacted(exc)["type"])
        db_connection_reopen()
        return {}


def operations_release_unpolled(*, ids: list[uuid.UUID], owner: str) -> int:
    """Hand back leases of claimed rows this loop will not poll (its time is up). They stay due."""
    if not ids:
        return 0
    try:
        return Operation.objects.filter(id__in=ids, lease_owner=owner).update(
            **schedule_at(at=Coalesce(F("next_poll_at"), timezone.now())), updated_at=timezone.now())
    except (OperationalError, InterfaceError):
        db_connection_reopen()
        return 0  # the leases expire on their own


@dataclass
class LoopStats:
    polls: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    tick_errors: int = 0


def executor_loop(
    *, owner: str, claim: Callable[[], list[uuid.UUID]], next_due: Callable[[], datetime | None],
    until_idle: bool, max_seconds: float | None, tick: Callable[[], object] | None = None,
) -> LoopStats:
    """Claim and poll due rows until idle (with `until_idle`) or the time is up.

    Returns within `max_seconds` plus one row's cycle (itself bounded by the request deadline):
    the clock is checked before every row, never only between batches.
    """
    stats = LoopStats()
    deadline = None if max_seconds is None else time.monotonic() + max_seconds

    def left() -> float:
        return float("inf") if deadline is None else deadline - time.monotonic()

    def nap(seconds: float) -> None:
        time.sleep(max(0.0, min(seconds, left())))

    while left() > 0:
        try:
            if tick is not None:
                tick()
            ids = claim()
        except Exception as exc:
            stats.tick_errors += 1
            logger.warning("executor tick failed: %s", exception_redacted(exc)["type"])
            db_connection_reopen()
            nap(TICK_ERROR_NAP_SECONDS)
            continue
        loaded: dict[uuid.UUID, Operation] = {}
        for i, op_id in enumerate(ids):
            if left() <= 0:
                operations_release_unpolled(ids=ids[i:], owner=owner)
                return stats
            if i % READ_AHEAD_ROWS == 0:
                # Read a few rows at a time, not the whole claim: a row read long before its
                # poll would only have its writes refused (and its poll spent) more often.
                loaded = operations_load_for_poll(operation_ids=ids[i:i + READ_AHEAD_ROWS])
            outcome = operation_poll_guarded(operation_id=op_id, lease_owner=owner,
                                             loaded=loaded.get(op_id)).split(":")[0]
            stats.polls += 1
            stats.outcomes[outcome] = stats.outcomes.get(outcome, 0) + 1
        try:
            due = next_due()
        except Exception as exc:
            stats.tick_errors += 1
            logger.warning("executor schedule query failed: %s", exception_redacted(exc)["type"])
            db_connection_reopen()
            nap(TICK_ERROR_NAP_SECONDS)
            continue
        if due is None:
            if until_idle:
                return stats
            nap(MAX_IDLE_SLEEP_SECONDS)
            continue
        wait = (due - timezone.now()).total_seconds()
        if wait > 0:
            nap(min(wait, MAX_IDLE_SLEEP_SECONDS))
    return stats
