"""The one acceptance point: `operation_accept_terminal`.

It is the only code that writes a TerminalReceipt or an OutboxEvent. It runs in a durable
transaction (never nested inside a caller's), locks the operation row first (lock order: the
operation row, then the receipt and outbox inserts), re-checks every identity field against the
locked row, and only then writes the receipt, exactly one outbox row and the final state. The
database constraints (one receipt per call node and epoch, one outbox row per receipt) are the
backstop should two acceptors ever pass the checks at once.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.errors import AcceptanceRefused, OperationNotFound
from ledger.models import InputRequest, Operation, OperationEvent, OutboxEvent, TerminalReceipt
from ledger.services.events import event_append_locked, operation_record_event
from ledger.services.shadow import shadow_comparisons_complete_locked
from ledger.states import State, TerminalStatus

logger = logging.getLogger("ledger.acceptance")


def _check(field: str, expected: Any, claimed: Any) -> None:
    if expected != claimed:
        raise AcceptanceRefused(
            f"{field} mismatch: ledger has {expected!r}, claim has {claimed!r}", field=field
        )


def _accept_locked(
    *,
    operation_id: uuid.UUID,
    call_node_id: str,
    request_digest: str,
    remote_id: str,
    descriptor_version: str,
    execution_epoch: int,
    cancel_generation: int,
    terminal_status: str,
    result_digest: str,
) -> TerminalReceipt:
    op = Operation.objects.select_for_update().filter(id=operation_id).first()
    if op is None:
        raise OperationNotFound(str(operation_id))
    if op.shadow:
        # Shadow rows never take a receipt slot and never reach the outbox (issue 9): they are
        # settled by ledger.services.shadow.operation_accept_shadow_terminal.
        raise AcceptanceRefused("a shadow operation never gets a receipt", field="shadow")

    # A confirmed cancel is accepted straight from CANCEL_REQUESTED; everything else only after the
    # result was fetched and digested (FETCHING_RESULT with a stored digest).
    if op.state == State.CANCEL_REQUESTED and terminal_status == TerminalStatus.CANCELLED:
        final_state = State.CANCELLED_ACCEPTED
    elif op.state == State.FETCHING_RESULT:
        final_state = State.ACCEPTED
        _check("terminal_status", op.terminal_status, terminal_status)
        if not op.result_digest:
            raise AcceptanceRefused("result was not fetched and digested", field="result_digest")
    else:
        raise AcceptanceRefused(f"state {op.state} cannot be accepted", field="state")

    _check("call_node_id", op.call_node_id, call_node_id)
    _check("request_digest", op.request_digest, request_digest)
    _check("remote_id", op.remote_id, remote_id)
    _check("descriptor_version", op.descriptor_version, descriptor_version)
    _check("execution_epoch", op.execution_epoch, execution_epoch)
    _check("cancel_generation", op.cancel_generation, cancel_generation)
    _check("result_digest", op.result_digest, result_digest)

    cancelled = terminal_status == TerminalStatus.CANCELLED
    try:
        receipt = TerminalReceipt.objects.create(
            operation=op,
            tenant=op.tenant,
            call_node_id=op.call_node_id,
            execution_epoch=op.execution_epoch,
            terminal_status=terminal_status,
            request_digest=op.request_digest,
            remote_id=op.remote_id,
            descriptor_version=op.descriptor_version,
            cancel_generation=op.cancel_generation,
            result_digest=op.result_digest,
            # A cancelled call has no success payload; anything fetched joins the audit record.
            payload=None if cancelled else op.result,
            audit={"result_kind": op.result_kind, "late_result": op.result} if cancelled else {},
        )
        OutboxEvent.objects.create(
            receipt=receipt,
            payload={
                "receipt_id": receipt.pk,
                "operation_id": str(op.id),
                "call_node_id": op.call_node_id,
                "execution_epoch": op.execution_epoch,
                "terminal_status": terminal_status,
                "result_digest": op.result_digest,
                "payload": receipt.payload,
            },
        )
    except IntegrityError as exc:
        raise AcceptanceRefused(
            f"a receipt already exists for call node {op.call_node_id} epoch {op.execution_epoch}",
            field="receipt",
        ) from exc

    # Shadows of this call that finished first wait for this receipt to be compared.
    shadow_comparisons_complete_locked(legacy=op, receipt=receipt)
    # An ended operation's open input rounds can never be answered (however it ended: the
    # server's terminal state, a confirmed cancel, an operator's attested one). Same transaction
    # as the receipt, so no gate ever offers an answer for an accepted row.
    input_rounds_withdraw(operation_id=op.id)
    now = timezone.now()
    Operation.objects.filter(id=op.id, state=op.state).update(
        state=final_state,
        terminal_status=terminal_status,
        next_poll_at=None,
        lease_owner="",
        lease_expires_at=None,
        updated_at=now,
    )
    event_append_locked(
        operation_id=op.id,
        kind="accepted",
        from_state=op.state,
        to_state=final_state,
        server_state=op.server_state,
        execution_epoch=op.execution_epoch,
        cancel_generation=op.cancel_generation,
        data={"receipt_id": receipt.pk, "terminal_status": terminal_status,
              **_cancel_figures(op=op, cancelled=cancelled, now=now)},
    )
    return receipt


def input_rounds_withdraw(*, operation_id: uuid.UUID) -> int:
    """Open input rounds of an ended operation can no longer be answered."""
    return InputRequest.objects.filter(
        operation_id=operation_id, status=InputRequest.Status.OPEN
    ).update(status=InputRequest.Status.WITHDRAWN)


def _cancel_figures(*, op: Operation, cancelled: bool, now: datetime) -> dict[str, Any]:
    """For a row with a cancel request: whether the cancel won and how long confirmation took
    (request to accepted terminal), stored in the accepted event so a gate reads it from the ledger."""
    if op.cancel_generation == 0:
        return {}
    requested_at = (
        OperationEvent.objects.filter(operation_id=op.id, kind="cancel_requested",
                                      cancel_generation=op.cancel_generation)
        .values_list("created_at", flat=True).first()
    )
    figures: dict[str, Any] = {"cancel_outcome": "won" if cancelled else "lost"}
    if op.result_kind == "attested":
        # The server never confirmed: an operator settled the row from the queue. The latency
        # is the operator's, reported apart from the server's confirmation latency.
        figures["settled_by"] = "operator"
    if requested_at is not None:
        figures["cancel_confirmation_ms"] = round((now - requested_at).total_seconds() * 1000, 3)
    return figures


def operation_accept_terminal(
    *,
    operation_id: uuid.UUID,
    call_node_id: str,
    request_digest: str,
    remote_id: str,
    descriptor_version: str,
    execution_epoch: int,
    cancel_generation: int,
    terminal_status: str,
    result_digest: str,
) -> TerminalReceipt:
    """Accept one terminal state, or raise AcceptanceRefused having changed nothing but the log."""
    try:
        with transaction.atomic(durable=True):
            return _accept_locked(
                operation_id=operation_id,
                call_node_id=call_node_id,
                request_digest=request_digest,
                remote_id=remote_id,
                descriptor_version=descriptor_version,
                execution_epoch=execution_epoch,
                cancel_generation=cancel_generation,
                terminal_status=terminal_status,
                result_digest=result_digest,
            )
    except AcceptanceRefused as exc:
        # The refused transaction rolled back; the refusal itself is recorded in its own.
        logger.warning("acceptance refused for %s: %s", operation_id, exc.reason)
        operation_record_event(
            operation_id=operation_id,
            kind="acceptance_refused",
            data={"reason": exc.reason, "field": exc.field, "claimed_status": terminal_status},
        )
        raise
