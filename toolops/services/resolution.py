"""What the executor can prove when a task is missing: submission-unknown resolution and 404s.

Submission unknown (docs/state-table.md): the create answer was lost, so the request may or
may not have created a task. Resolution asks the server by the submission key with what the
adapter offers for this server (`key_resolution_modes`):
* KEY_LOOKUP / KEY_DEDUP_RESEND: PROOF. A task returned is the one created for this key (WORKING);
  the server's fenced "unknown key" proves nothing exists and nothing can appear (NOT_FOUND_SAFE).
* LIST_SCAN: CANDIDATES only (a Task carries no key, tool or arguments); they become evidence for
  the operator, never a state change.
No proof by the resolution deadline, or no proving mode at all: the manual queue.

Missing task (404 / -32602, expired ttl, lost session) is classified:
* NEVER_CREATED: proven by the key (only possible without a remote id; see above);
* EXPIRED_WITH_RECEIPT: the terminal state was observed and its result digested before the task
  vanished; nothing more is needed from the server, acceptance proceeds;
* UNKNOWN: everything else, to the manual queue. Never a resubmission.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import IntegrityError
from django.utils import timezone

from adapters import (
    AdapterError,
    NeverCreatedError,
    NotFoundError,
    SessionLostError,
)
from adapters.base import KEY_DEDUP_RESEND, KEY_LOOKUP, LIST_SCAN, RemoteTask, ResendRequest
from ledger.models import Operation, OperationEvent
from ledger.selectors.rows import operation_load
from ledger.services.events import operation_record_event
from ledger.services.schedule import RELEASE, schedule_at, schedule_cleared, schedule_now
from ledger.services.transitions import operation_transition, operation_update_guarded
from ledger.states import State
from toolops.errors import ToolopsError
from toolops.scheduling import next_poll_at
from toolops.services.connections import RateLimited, adapter_for_server, server_call
from toolops.services.reconcile import operation_to_reconciliation
from toolops.services.schedule import operation_reschedule_rate_limited, task_schedule_fields
from toolops.services.servers import server_renegotiate

PROVING_MODES = frozenset({KEY_LOOKUP, KEY_DEDUP_RESEND})
# Lookups back off from 1 s to this cap: a few tries within the resolution deadline, no storm.
LOOKUP_BACKOFF_CAP_S = 15.0
# Candidates may be created a little before our row's timestamp (clock skew between hosts).
SCAN_SKEW = timedelta(seconds=5)


class Classification(StrEnum):
    NEVER_CREATED = "NEVER_CREATED"
    EXPIRED_WITH_RECEIPT = "EXPIRED_WITH_RECEIPT"
    UNKNOWN = "UNKNOWN"


def _unknown_since(*, op: Operation) -> tuple[datetime, dict[str, Any]]:
    """When the row became SUBMISSION_UNKNOWN, and the lost request's detail (its session)."""
    event = (
        OperationEvent.objects.filter(operation_id=op.id, to_state=State.SUBMISSION_UNKNOWN)
        .exclude(from_state=State.SUBMISSION_UNKNOWN).order_by("-seq").first()
    )
    if event is None:
        return op.created_at, {}
    detail = event.data.get("detail") if isinstance(event.data, dict) else None
    return event.created_at, detail if isinstance(detail, dict) else {}


def _candidates(*, op: Operation, modes: frozenset[str], until: datetime) -> list[dict[str, Any]]:
    if LIST_SCAN not in modes:
        return []
    try:
        found = server_call(
            server=op.server, purpose="lookup", follow_up=True,
            fn=lambda adapter: adapter.candidates_by_window(
                created_after=op.created_at - SCAN_SKEW, created_before=until + SCAN_SKEW),
        )
    except AdapterError as exc:
        return [{"scan_error": str(exc), "type": type(exc).__name__}]
    taken = set(
        Operation.objects.filter(server_id=op.server_id, remote_id__in=[t.remote_id for t in found])
        .values_list("remote_id", flat=True)
    )
    # Tasks already owned by another row are not candidates for this one.
    return [{"remote_id": t.remote_id, "status": t.status, "created_at": t.created_at}
            for t in found if t.remote_id not in taken]


def _found(*, op: Operation, lease_owner: str, task: RemoteTask, how: str) -> str:
    fields = task_schedule_fields(op=op, task=task, now=timezone.now())
    fields.update(schedule_now(release=False))  # poll at once: its state comes from `get`
    try:
        operation_transition(
            operation_id=op.id, from_state=State.SUBMISSION_UNKNOWN, to_state=State.WORKING,
            execution_epoch=op.execution_epoch, lease_owner=lease_owner,
            updates={**fields, **RELEASE, "remote_id": task.remote_id},
            event_kind="submission_resolved",
            event_data={"remote_id": task.remote_id, "how": how, "proof": True, "reply": task.raw},
        )
    except IntegrityError as exc:
        from toolops.services.remote_ids import is_remote_id_collision, operation_remote_id_collision

        if not is_remote_id_collision(exc):
            raise
        operation_remote_id_collision(operation_id=op.id, lease_owner=lease_owner,
                                      remote_id=task.remote_id, source=f"lookup:{how}")
        return "remote_id_collision"
    return "resolved_working"


def _to_queue(*, op: Operation, lease_owner: str, reason: str, evidence: dict[str, Any],
              modes: frozenset[str]) -> str:
    evidence = {**evidence, "modes": sorted(modes),
                "candidates": _candidates(op=op, modes=modes, until=timezone.now())}
    operation_to_reconciliation(op=op, lease_owner=lease_owner, reason=reason, evidence=evidence)
    return "reconciliation"


def operation_resolve_submission(*, operation_id: uuid.UUID, lease_owner: str) -> str:
    """One resolution pass for a leased SUBMISSION_UNKNOWN row. Never sends under a new key."""
    op = operation_load(operation_id=operation_id)
    now = timezone.now()
    if op is None:
        return "missing"
    if op.lease_owner != lease_owner or op.lease_expires_at is None or op.lease_expires_at <= now:
        return "stale_lease"
    if op.state != State.SUBMISSION_UNKNOWN:
        return "not_unknown"
    adapter = adapter_for_server(server=op.server)
    modes = adapter.key_resolution_modes(server_capabilities=op.server.capabilities)
    since, lost = _unknown_since(op=op)
    if not modes & PROVING_MODES:
        # Nothing automatic is possible: straight to the operator, with candidates if listable.
        return _to_queue(op=op, lease_owner=lease_owner, reason="submission_unknown_no_lookup",
                         evidence={"lost": lost}, modes=modes)
    deadline = since + timedelta(seconds=float(settings.TOOLOPS_SUBMISSION_RESOLUTION_SECONDS))
    resend = None
    if op.execution_mode == "task":
        resend = ResendRequest(tool=op.tool_name, arguments=dict(op.body.get("arguments") or {}),
                               ttl_ms=op.body.get("ttl_ms"))
    try:
        # follow_up: a lookup is rare and everything about the row waits on it, so a token due
        # within two intervals is waited for rather than lost to the polls of a busy server.
        task = server_call(server=op.server, purpose="lookup", follow_up=True,
                           fn=lambda a: a.lookup_by_key(
            submission_key=op.submission_key, created_after=op.created_at,
            server_capabilities=op.server.capabilities,
            submitted_session=str(lost.get("session") or "") or None, resend=resend,
        ))
    except RateLimited as limited:
        # Nothing was sent: our own pacing, not an answer. The row comes back when the bucket
        # has a token (as a refused poll does), not after the lookup backoff: under a saturated
        # cap a lookup retried every 15 s loses every draw to the polls retried at the bucket's
        # pace, and the row would reach its deadline having asked nothing.
        if now >= deadline:
            return _to_queue(op=op, lease_owner=lease_owner, reason="submission_unknown_deadline",
                             evidence={"lost": lost, "error": str(limited),
                                       "type": type(limited).__name__,
                                       "deadline": deadline.isoformat()}, modes=modes)
        operation_reschedule_rate_limited(op=op, lease_owner=lease_owner, limited=limited)
        return "rate_limited"
    except NeverCreatedError as exc:
        operation_transition(
            operation_id=op.id, from_state=State.SUBMISSION_UNKNOWN, to_state=State.NOT_FOUND_SAFE,
            execution_epoch=op.execution_epoch, lease_owner=lease_owner,
            updates=schedule_cleared(), event_kind="never_created",
            event_data={"classification": Classification.NEVER_CREATED, "proof": True,
                        "evidence": str(exc), "detail": exc.detail},
        )
        return "never_created"
    except NotFoundError as exc:
        # Created for this key (the server matched it), but unreachable from here: lost session
        # or already gone. Proof that it exists, so never NOT_FOUND_SAFE.
        reason = "found_in_lost_session" if isinstance(exc, SessionLostError) else "found_but_gone"
        return _to_queue(op=op, lease_owner=lease_owner, reason=reason,
                         evidence={"error": str(exc), "detail": exc.detail, "lost": lost}, modes=modes)
    except AdapterError as exc:
        task = None
        last_error: dict[str, Any] = {"error": str(exc), "type": type(exc).__name__}
    else:
        last_error = {}
    if task is not None:
        return _found(op=op, lease_owner=lease_owner, task=task,
                      how="key_lookup" if KEY_LOOKUP in modes else "dedup_resend")
    if now >= deadline:
        return _to_queue(op=op, lease_owner=lease_owner, reason="submission_unknown_deadline",
                         evidence={"lost": lost, **last_error, "deadline": deadline.isoformat()},
                         modes=modes)
    retry_s = min(2.0 ** min(op.poll_attempts, 6), LOOKUP_BACKOFF_CAP_S)
    operation_update_guarded(
        operation_id=op.id, state=State.SUBMISSION_UNKNOWN, execution_epoch=op.execution_epoch,
        lease_owner=lease_owner,
        updates=schedule_at(at=min(
            next_poll_at(now=now, poll_interval_ms=None, expires_at=None, retry_after_s=retry_s),
            deadline)),
        event_kind="submission_lookup", event_data={"found": False, **last_error},
    )
    return "lookup_pending"


def operation_classify_missing(
    *, op: Operation, lease_owner: str | None, cause: str, error: AdapterError | None = None,
) -> Classification:
    """Classify a task the server no longer shows (404, expiry, lost session) and act on it."""
    detail: dict[str, Any] = {"cause": cause}
    if error is not None:
        detail.update(error=str(error), type=type(error).__name__, detail=error.detail)
    if isinstance(error, SessionLostError):
        # Open a new session for everyone else; this row's task stayed in the old one.
        try:
            server_renegotiate(server_id=op.server_id, stale_session_id=op.server.session_id)
        except ToolopsError as exc:  # the server is down: the next submit or poll retries
            detail["renegotiate_error"] = str(exc)
    if op.state == State.FETCHING_RESULT and op.result_digest:
        operation_record_event(operation_id=op.id, kind="classified",
                               data={"classification": Classification.EXPIRED_WITH_RECEIPT, **detail})
        return Classification.EXPIRED_WITH_RECEIPT
    # A row with a remote id was created (the server gave us the id): never NEVER_CREATED here.
    operation_to_reconciliation(
        op=op, lease_owner=lease_owner, reason=cause,
        evidence={"classification": Classification.UNKNOWN, **detail},
    )
    return Classification.UNKNOWN
