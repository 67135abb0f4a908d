"""Cancel as a request (docs/state-table.md, docs/protocols.md).

A cancel is a request, never a local verdict. `operation_cancel` commits CANCEL_REQUESTED with a
bumped cancel generation before anything is sent, then sends `tasks/cancel`:

* a cancel reply (the Task, already `cancelled`) is the evidence: acceptance writes a `cancelled`
  receipt; a result still fetchable joins the audit record only;
* `-32602` "already terminal": `tasks/get` says which terminal state won, and that one is fetched
  and accepted (completed stays completed, never rewritten to cancelled);
* a lost ack (timeout, dropped connection): the row stays CANCEL_REQUESTED and is polled until the
  server says which terminal state won (`operation_observe_cancel_requested`).

After a cancel is accepted, any later completion is recorded as an `EffectReconciliation` beside the
state (`operation_record_late_effect`); nothing advances.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from adapters import (
    AdapterError,
    AlreadyTerminalError,
    LostResponseError,
    NotFoundError,
    ProtocolViolationError,
    TransientError,
)
from adapters.base import FetchedResult, RemoteTask
from ledger.digests import canonical_digest
from ledger.errors import AcceptanceRefused, IllegalTransition
from ledger.models import EffectReconciliation, Operation, OperationEvent
from ledger.services.acceptance import operation_accept_terminal
from ledger.services.events import event_append_locked, operation_record_event
from ledger.services.schedule import RELEASE, schedule_at, schedule_leased
from ledger.services.transitions import operation_transition, operation_update_guarded
from ledger.states import State, TerminalStatus
from toolops.errors import ToolopsError
from toolops.scheduling import next_poll_at
from toolops.services.connections import server_call
from toolops.services.permissions import SYSTEM, Action, Actor, operation_tenant, permission_require
from toolops.services.reconcile import operation_to_reconciliation
from toolops.services.results import operation_fetch_and_accept, operation_record_terminal_seen

logger = logging.getLogger("toolops.cancel")

CANCELLABLE = frozenset({State.WORKING, State.INPUT_REQUIRED})
# A result fetched after a confirmed cancel is audit material only; never wait long for it (the
# server may already have deleted the task, and the receipt does not depend on it).
AUDIT_FETCH_TIMEOUT_S = 2.0
# Statuses that, seen after an accepted cancel, mean the work went on to an end of its own.
LATE_EFFECT_STATUSES = frozenset({TerminalStatus.COMPLETED.value, TerminalStatus.FAILED.value})


CANCEL_NOT_SENT = "cancel_not_sent"
# Events that record how the latest cancel send ended (or that one was asked for).
CANCEL_SEND_KINDS = ("cancel_requested", CANCEL_NOT_SENT, "cancel_ack_lost", "cancel_send_failed",
                     "cancel_reply_not_cancelled")


class CancelRefused(ToolopsError):
    pass


def _lease_owner() -> str:
    return f"cancel-{uuid.uuid4().hex[:12]}"


def _request_cancel(*, operation_id: uuid.UUID, owner: str, requested_by: str = "") -> Operation:
    """Lock, bump the generation, move to CANCEL_REQUESTED and take the lease; commit."""
    now = timezone.now()
    lease_s = float(settings.TOOLOPS_LEASE_SECONDS)
    refused_state = ""
    with transaction.atomic(durable=True):
        op = Operation.objects.select_for_update().filter(id=operation_id).first()
        if op is None:
            raise CancelRefused(f"no operation {operation_id}")
        if op.state not in CANCELLABLE:
            refused_state = op.state
        else:
            generation = op.cancel_generation + 1
            # The lease is ours while the cancel is in flight: a poller that held the row loses
            # its lease guard and writes nothing; if we die, the lease expires and the row, already
            # due, is polled until the server says which terminal state won.
            operation_transition(
                operation_id=op.id, from_state=op.state, to_state=State.CANCEL_REQUESTED,
                execution_epoch=op.execution_epoch, cancel_generation=op.cancel_generation,
                updates={"cancel_generation": generation,
                         **schedule_leased(owner=owner, until=now + timedelta(seconds=lease_s))},
                event_kind="cancel_requested",
                event_data={"requested_at": now.isoformat(), "cancel_generation": generation,
                            "from_state": op.state, "requested_by": requested_by},
            )
    if refused_state:
        # Recorded outside the locking transaction so the refusal survives it.
        operation_record_event(operation_id=operation_id, kind="cancel_refused",
                               data={"reason": f"state {refused_state}"})
        detail = (" (cancel already requested; polling continues until the server answers)"
                  if refused_state == State.CANCEL_REQUESTED else "")
        raise CancelRefused(
            f"operation {operation_id} is {refused_state}; only WORKING or INPUT_REQUIRED can be "
            f"cancelled{detail}"
        )
    return Operation.objects.select_related("server").get(id=operation_id)


def operation_cancel(*, operation_id: uuid.UUID, actor: Actor | str = SYSTEM) -> str:
    """Request a cancel and send it; returns a short outcome label.

    Raises CancelRefused (having recorded the refusal) when the row is not cancellable, and
    PermissionRefused when `actor` may not cancel it (toolops/services/permissions.py).
    """
    permission_require(actor=actor, action=Action.CANCEL, tenant=operation_tenant(operation_id))
    owner = _lease_owner()
    who = actor.name if isinstance(actor, Actor) else str(actor)
    op = _request_cancel(operation_id=operation_id, owner=owner, requested_by=who)
    return _send_cancel(op=op, owner=owner)


def _send_cancel(*, op: Operation, owner: str) -> str:
    """Send `tasks/cancel` for a CANCEL_REQUESTED row whose lease `owner` holds."""
    try:
        # Under the server's QPS cap; no token raises RateLimited, a TransientError: not sent.
        # follow_up: an operator is waiting on this call, so a token due within two intervals
        # is waited for rather than deferring the cancel to the next poll cycle.
        task = server_call(server=op.server, purpose="cancel", follow_up=True,
                           fn=lambda adapter: adapter.cancel(remote_id=op.remote_id))
    except AlreadyTerminalError as exc:
        return _already_terminal(op=op, lease_owner=owner, error=exc)
    except TransientError as exc:
        # Refused before it can have reached the server: the poller sends it again.
        return _ack_lost(op=op, lease_owner=owner, error=exc, kind=CANCEL_NOT_SENT)
    except LostResponseError as exc:
        return _ack_lost(op=op, lease_owner=owner, error=exc)
    except AdapterError as exc:
        # A definite refusal that is not "already terminal" (no cancel support, a protocol
        # violation): the request stands; polling tells us how the task ends.
        return _ack_lost(op=op, lease_owner=owner, error=exc, kind="cancel_send_failed")
    if task.status != "cancelled":
        # 2025-11-25 moves the task to cancelled before replying; anything else is no evidence.
        return _ack_lost(op=op, lease_owner=owner,
                         error=AdapterError(f"cancel reply says {task.status!r}"),
                         kind="cancel_reply_not_cancelled")
    return operation_accept_cancelled(op=op, lease_owner=owner, task=task, source="cancel_reply")


def _ack_lost(*, op: Operation, lease_owner: str, error: AdapterError,
              kind: str = "cancel_ack_lost") -> str:
    """Stay CANCEL_REQUESTED; poll at the server's pace until it says which terminal state won."""
    retry_after = error.retry_after if isinstance(error, TransientError) else None
    due = next_poll_at(now=timezone.now(), poll_interval_ms=op.poll_interval_ms,
                       expires_at=op.expires_at, retry_after_s=retry_after)
    operation_update_guarded(
        operation_id=op.id, state=State.CANCEL_REQUESTED, execution_epoch=op.execution_epoch,
        cancel_generation=op.cancel_generation, lease_owner=lease_owner,
        updates=schedule_at(at=due),
        event_kind=kind,
        event_data={"error": str(error), "type": type(error).__name__, "detail": error.detail},
    )
    return kind


def _already_terminal(*, op: Operation, lease_owner: str, error: AdapterError) -> str:
    """-32602 to tasks/cancel: read the real terminal state and accept that one."""
    operation_record_event(operation_id=op.id, kind="cancel_already_terminal",
                           data={"error": str(error), "detail": error.detail})
    try:
        task = server_call(server=op.server, purpose="poll", follow_up=True,
                           fn=lambda adapter: adapter.get(remote_id=op.remote_id))
    except NotFoundError as exc:
        # -32602 also means "unknown id" (mcp-tasks.md 2.8): no proof of any terminal state.
        operation_to_reconciliation(
            op=op, lease_owner=lease_owner, reason="cancel_target_not_found",
            evidence={"error": str(exc), "detail": exc.detail},
        )
        return "not_found"
    except AdapterError as exc:
        return _ack_lost(op=op, lease_owner=lease_owner, error=exc)
    if task.status not in TerminalStatus.values:
        # The server said "already terminal" and its own read says otherwise (a reordered or
        # stale answer): neither is evidence of how the task ended. The request stands and the
        # row is polled at the server's pace until a terminal status is read.
        return _ack_lost(
            op=op, lease_owner=lease_owner, kind="cancel_reply_contradicted",
            error=ProtocolViolationError(
                f"tasks/cancel said already terminal, tasks/get says {task.status!r}"),
        )
    return operation_observe_cancel_requested(op=op, lease_owner=lease_owner, task=task,
                                              observation_seq=None)


def operation_observe_cancel_requested(
    *, op: Operation, lease_owner: str, task: RemoteTask, observation_seq: int | None
) -> str:
    """A terminal status seen while CANCEL_REQUESTED (cancel reply lost, or already terminal)."""
    if task.status == "cancelled":
        return operation_accept_cancelled(op=op, lease_owner=lease_owner, task=task, source="poll")
    # Completion won the race: the real outcome is accepted and the cancel recorded as lost, but
    # only once this observation has moved the row. A stale worker's copy of the same answer
    # (an older epoch, a lost lease) must not leave a `cancel_lost` it had no right to write.
    try:
        operation_record_terminal_seen(
            operation_id=op.id, from_state=State.CANCEL_REQUESTED, lease_owner=lease_owner,
            task=task, observation_seq=observation_seq,
        )
    except IllegalTransition:
        return "stale_observation"
    operation_record_event(operation_id=op.id, kind="cancel_lost",
                           data={"server_status": task.status,
                                 "cancel_generation": op.cancel_generation})
    return operation_fetch_and_accept(operation_id=op.id, lease_owner=lease_owner)


def _cancel_unsent(*, op: Operation) -> bool:
    last = (OperationEvent.objects.filter(operation_id=op.id, kind__in=CANCEL_SEND_KINDS,
                                          cancel_generation=op.cancel_generation)
            .order_by("-seq").values_list("kind", flat=True).first())
    return last == CANCEL_NOT_SENT


def operation_observe_cancel_pending(
    *, op: Operation, lease_owner: str, task: RemoteTask, fields: dict[str, Any],
    data: dict[str, Any], seq_guard: dict[str, Any],
) -> str:
    """A non-terminal status while CANCEL_REQUESTED: polling never pauses (not even for
    `input_required`) until the server names the terminal state; a cancel that provably never
    left is sent again under the same generation."""
    if fields.get("next_poll_at") is None:
        fields = {**fields, **schedule_at(at=next_poll_at(
            now=timezone.now(), poll_interval_ms=task.poll_interval_ms,
            expires_at=fields.get("expires_at")), release=False)}
    resend = _cancel_unsent(op=op)
    ok = operation_update_guarded(
        operation_id=op.id, state=State.CANCEL_REQUESTED, execution_epoch=op.execution_epoch,
        cancel_generation=op.cancel_generation, lease_owner=lease_owner,
        # A resend keeps the lease: the send below writes under it.
        updates={**fields, **({} if resend else RELEASE)}, event_kind="observed",
        event_data={**data, "cancel_resend": resend}, extra_filters=seq_guard,
    )
    if not ok:
        return "stale_observation"
    if not resend:
        return "cancel_pending"
    return _send_cancel(op=op, owner=lease_owner)


def _audit_fetch(*, op: Operation) -> dict[str, Any]:
    """Whatever `tasks/result` still returns after the cancel: audit material, never a payload."""
    try:
        fetched: FetchedResult = server_call(
            server=op.server, purpose="result",
            fn=lambda adapter: adapter.fetch_result(remote_id=op.remote_id,
                                                    timeout_s=AUDIT_FETCH_TIMEOUT_S),
            follow_up=True,
        )
    except AdapterError as exc:
        return {"kind": "unavailable", "payload": None, "is_error": False,
                "error": str(exc), "error_type": type(exc).__name__}
    return {"kind": fetched.kind, "payload": fetched.payload, "is_error": fetched.is_error}


def operation_accept_cancelled(*, op: Operation, lease_owner: str, task: RemoteTask,
                               source: str) -> str:
    """The server confirmed `cancelled`: store the audit fetch, then accept as cancelled."""
    audit = {**_audit_fetch(op=op), "confirmed_by": source}
    digest = canonical_digest(audit)
    stored = operation_update_guarded(
        operation_id=op.id, state=State.CANCEL_REQUESTED, execution_epoch=op.execution_epoch,
        cancel_generation=op.cancel_generation, lease_owner=lease_owner,
        updates={"server_state": task.status, "server_status_message": task.status_message or "",
                 "result": audit, "result_kind": audit["kind"], "result_digest": digest},
        event_kind="cancel_confirmed",
        event_data={"source": source, "audit_kind": audit["kind"], "result_digest": digest},
    )
    if not stored:
        return "stale_lease"
    try:
        receipt = operation_accept_terminal(
            operation_id=op.id, call_node_id=op.call_node_id, request_digest=op.request_digest,
            remote_id=op.remote_id, descriptor_version=op.descriptor_version,
            execution_epoch=op.execution_epoch, cancel_generation=op.cancel_generation,
            terminal_status="cancelled", result_digest=digest,
        )
    except AcceptanceRefused:
        return "acceptance_refused"
    return f"accepted:{receipt.terminal_status}"


def operation_record_late_effect(
    *, operation_id: uuid.UUID, observed_status: str, source: str, evidence: dict[str, Any]
) -> EffectReconciliation | None:
    """A completion seen after an accepted cancel: record it beside the state, change nothing.

    Returns None when the row is not a cancelled-accepted one (the caller's observation is
    simply stale, not a late effect).
    """
    if observed_status not in LATE_EFFECT_STATUSES:
        return None
    with transaction.atomic():
        # Lock order: the operation row first, as every other writer.
        op = Operation.objects.select_for_update().filter(id=operation_id).first()
        if op is None or op.state != State.CANCELLED_ACCEPTED:
            return None
        effect = EffectReconciliation.objects.create(
            operation=op, observed_status=observed_status, source=source, evidence=evidence,
        )
        event_append_locked(
            operation_id=op.id, kind="effect_reconciliation_required",
            execution_epoch=op.execution_epoch, cancel_generation=op.cancel_generation,
            from_state=op.state, to_state=op.state, server_state=op.server_state,
            data={"effect_id": effect.pk, "observed_status": observed_status, "source": source},
        )
    logger.warning("late %s after accepted cancel of %s (%s)", observed_status, operation_id, source)
    return effect
