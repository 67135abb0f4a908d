"""What an answer (or a failed call) makes of a row's schedule: the next poll time from the
server's interval and ttl, backoff after errors, the release after a refused QPS token.

The fields themselves are spelled by `ledger.services.schedule`, the one owner of writes of
`next_poll_at` and the lease; this module decides the times and hands its fields to the guarded
UPDATE of the poll cycle.

The bottom of the services: it imports no other service that polls, fetches or accepts, so the
poll loop (observe), the fetch (results), cancel, inputs and resolution all build on it and none
of them needs an import inside a function to reach it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from adapters import AdapterError, TransientError
from adapters.base import RemoteTask
from ledger.models import Operation
from ledger.services.schedule import RELEASE, lease_extended, schedule_at, schedule_cleared
from ledger.services.transitions import operation_update_guarded
from toolops.scheduling import backoff_window_seconds, next_poll_after_error_at, next_poll_at
from toolops.services.connections import RateLimited

__all__ = ["RELEASE", "lease_release_or_hold", "operation_reschedule_after_error",
           "operation_reschedule_rate_limited", "task_schedule_fields"]


def lease_release_or_hold(*, next_poll_at: datetime | None, hold_until: datetime | None) -> dict[str, Any]:
    """The lease fields a working observation writes: RELEASE, or, when the caller will poll the
    row again in-process (its next poll falls before `hold_until`), the same owner's lease kept
    until just after that next poll.

    The held lease ends TOOLOPS_POLL_HOLD_GRACE_SECONDS after the next poll time: a holder that
    dies or falls behind stalls the row at most that long past its due time, after which the
    dispatcher claims it like any expired lease (the claim query is unchanged: a held row is
    leased, so it is not claimable before then).
    """
    if hold_until is None or next_poll_at is None or next_poll_at > hold_until:
        return RELEASE
    return lease_extended(until=next_poll_at + timedelta(
        seconds=float(settings.TOOLOPS_POLL_HOLD_GRACE_SECONDS)))


def _task_expiry(*, task: RemoteTask, now: datetime) -> datetime | None:
    if task.ttl_ms is None:
        return None
    created = parse_datetime(task.created_at) if task.created_at else None
    return (created or now) + timedelta(milliseconds=task.ttl_ms)


def task_schedule_fields(*, op: Operation, task: RemoteTask, now: datetime) -> dict[str, Any]:
    """Fields an observation of `task` sets: verbatim server state, interval, expiry, next poll,
    and the poll counters (a working poll is counted on the row, not written as an event)."""
    expires = op.expires_at
    server_expiry = _task_expiry(task=task, now=now)
    if server_expiry is not None and (expires is None or server_expiry < expires):
        expires = server_expiry
    paused = task.status == "input_required"
    return {
        "server_state": task.status,
        "server_status_message": task.status_message or "",
        "poll_interval_ms": task.poll_interval_ms,
        "ttl_ms": task.ttl_ms,
        "expires_at": expires,
        # input_required pauses polling: the row resumes when its input round is answered.
        **(schedule_cleared(release=False) if paused else schedule_at(at=next_poll_at(
            now=now, poll_interval_ms=task.poll_interval_ms, expires_at=expires
        ), release=False)),
        "last_polled_at": now,
        # An answer ends a run of failed calls: the next error starts its backoff afresh.
        "poll_errors_in_row": 0,
    }


def operation_reschedule_after_error(
    *, op: Operation, lease_owner: str, error: AdapterError, kind: str
) -> bool:
    """Record a failed protocol call and try again later (backoff, full jitter, Retry-After as a
    floor, never past the expiry); the row does not advance.

    The run of failures is a counter on the row (reset by any answer), so the backoff needs no
    read of the event log. Returns False, writing nothing, when the row moved on meanwhile (an
    epoch bump, a lost lease): the caller reports that as stale so a refusal can be recorded.
    """
    retry_after = error.retry_after if isinstance(error, TransientError) else None
    errors = op.poll_errors_in_row + 1
    now = timezone.now()
    return operation_update_guarded(
        operation_id=op.id, state=op.state, execution_epoch=op.execution_epoch,
        lease_owner=lease_owner,
        updates={
            "poll_errors_in_row": F("poll_errors_in_row") + 1,
            "last_polled_at": now,
            **schedule_at(at=next_poll_after_error_at(
                now=now, poll_interval_ms=op.poll_interval_ms, expires_at=op.expires_at,
                consecutive_errors=errors, retry_after_s=retry_after,
            )),
        },
        event_kind=kind,
        event_data={"error": str(error), "type": type(error).__name__, "detail": error.detail,
                    "retry_after": retry_after, "consecutive_errors": errors,
                    "backoff_window_s": backoff_window_seconds(consecutive_errors=errors)},
        known={"cancel_generation": op.cancel_generation, "server_state": op.server_state},
    )


def operation_reschedule_rate_limited(*, op: Operation, lease_owner: str, limited: RateLimited) -> bool:
    """No QPS token: nothing was sent, so nothing is observed; release the row until `retry_at`.

    One guarded UPDATE and no event: a refusal is our own pacing, not a fact about the operation,
    and under a saturated cap it is the most frequent outcome, so it must stay cheap. The
    `poll_attempts` claimed for it stay counted: they number the issued polls (see operation_poll).
    """
    at = limited.retry_at
    if op.expires_at is not None and at > op.expires_at:
        at = max(op.expires_at, timezone.now())
    return Operation.objects.filter(
        id=op.id, state=op.state, execution_epoch=op.execution_epoch, lease_owner=lease_owner,
    ).update(**schedule_at(at=at)) == 1
