"""The Python embedding API: toolops called in-process by the host Django application.

(The HTTP API is toolops/rest/, built on these functions. `toolops.api` is this module's stable
import path.)

Everything a host application needs is here, as keyword-only functions returning plain frozen
dataclasses (never ORM rows): submit a call for a call node, read an operation, cancel it, answer
an input round, list open input requests, and consume ready outbox events. Every other module of
toolops and ledger is internal and may change.

    from toolops import api

    op = api.submit_call(server="search", tool="deep_research", call_node_id="plan-7/step-3",
                         arguments={"q": "tides"}, idempotency_key="plan-7/step-3/try-1")
    api.get_operation(operation_id=op.id).state          # "WORKING", later "ACCEPTED"

    def advance(*, event: dict, idempotency_key: str) -> None:
        my_workflow.advance_once(event["call_node_id"], event["payload"], key=idempotency_key)

    api.consume_outbox(handler=advance)                 # call periodically (or run the relay task)

Refusals raise subclasses of `ToolopsError` with a one-line reason (for example `CancelRefused`
for a row that is already terminal, `InputAnswerRefused` for a wrong round or a stale digest).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ledger.models import InputRequest, Operation, ReconciliationItem, TerminalReceipt
from ledger.states import State
from toolops.errors import ToolopsError
from toolops.services.answer_checks import InputAnswerRefused
from toolops.services.cancel import CancelRefused, operation_cancel
from toolops.services.idempotency import (
    IdempotencyInProgress,
    IdempotencyMismatch,
    operation_submit_idempotent,
)
from toolops.services.inputs import operation_answer_input
from toolops.services.outbox import RelayStats, outbox_relay
from toolops.services.permissions import (
    SYSTEM,
    Actor,
    PermissionRefused,
    actor_for_user,
    actor_system,
)
from toolops.services.reconcile import (
    AlreadyResolved,
    EvidenceRejected,
    ReconciliationRefused,
    reconciliation_resolve,
)

__all__ = [
    "SYSTEM",
    "Actor",
    "AlreadyResolved",
    "CancelRefused",
    "EvidenceRejected",
    "IdempotencyInProgress",
    "IdempotencyMismatch",
    "InputAnswerRefused",
    "InputRequestView",
    "OperationNotVisible",
    "OperationView",
    "PermissionRefused",
    "ReceiptView",
    "ReconciliationRefused",
    "RelayStats",
    "ToolopsError",
    "actor_for_user",
    "actor_system",
    "answer_input",
    "cancel_operation",
    "consume_outbox",
    "get_operation",
    "list_open_input_requests",
    "resolve_reconciliation_item",
    "submit_call",
]


class OperationNotVisible(ToolopsError):
    """No such operation for this tenant (another tenant's operations are reported the same way)."""


@dataclass(frozen=True)
class ReceiptView:
    id: int
    terminal_status: str
    result_digest: str
    payload: Any
    accepted_at: datetime


@dataclass(frozen=True)
class OperationView:
    id: uuid.UUID
    call_node_id: str
    server: str
    tool_name: str
    state: str
    server_state: str
    terminal_status: str
    input_round: int
    cancel_generation: int
    execution_epoch: int
    created_at: datetime
    updated_at: datetime
    receipt: ReceiptView | None


@dataclass(frozen=True)
class InputRequestView:
    id: int
    operation_id: uuid.UUID
    round: int
    method: str
    params: dict[str, Any]
    schema_digest: str
    deadline: datetime


def _receipt_view(op: Operation) -> ReceiptView | None:
    receipt = TerminalReceipt.objects.filter(operation_id=op.id).first()
    if receipt is None:
        return None
    return ReceiptView(id=receipt.pk, terminal_status=receipt.terminal_status,
                       result_digest=receipt.result_digest, payload=receipt.payload,
                       accepted_at=receipt.accepted_at)


_LOOKUP = object()


def _operation_view(op: Operation, receipt: object = _LOOKUP) -> OperationView:
    return OperationView(
        id=op.id, call_node_id=op.call_node_id, server=op.server.name, tool_name=op.tool_name,
        state=op.state, server_state=op.server_state, terminal_status=op.terminal_status,
        input_round=op.input_round, cancel_generation=op.cancel_generation,
        execution_epoch=op.execution_epoch, created_at=op.created_at, updated_at=op.updated_at,
        receipt=_receipt_view(op) if receipt is _LOOKUP else None,
    )


def _visible(*, operation_id: uuid.UUID, tenant: str | None) -> Operation:
    qs = Operation.objects.select_related("server").filter(id=operation_id)
    if tenant is not None:
        qs = qs.filter(tenant=tenant)
    op = qs.first()
    if op is None:
        raise OperationNotVisible(f"no operation {operation_id}")
    return op


def submit_call(
    *, server: str, tool: str, call_node_id: str, arguments: dict[str, Any] | None = None,
    ttl_ms: int | None = None, idempotency_key: str | None = None, tenant: str = "",
    actor: Actor = SYSTEM,
) -> OperationView:
    """Submit one call for a call node. With `idempotency_key`, a retry returns the same operation.

    `actor`: who acts (default: the host process, `SYSTEM`); pass `actor_for_user(user=...)` when
    acting for a user, whose permission or organisation role is then checked.
    """
    op, created = operation_submit_idempotent(
        tenant=tenant, idempotency_key=idempotency_key, server_name=server, tool_name=tool,
        call_node_id=call_node_id, arguments=arguments, ttl_ms=ttl_ms, actor=actor,
    )
    if created and op.state not in (State.ACCEPTED, State.CANCELLED_ACCEPTED):
        # The row as the submit wrote it (server attached, no receipt yet): no read back.
        return _operation_view(op, receipt=None)
    return _operation_view(Operation.objects.select_related("server").get(id=op.id))


def get_operation(*, operation_id: uuid.UUID, tenant: str | None = None) -> OperationView:
    """One operation with its receipt (if accepted). `tenant=None` means no tenant filter."""
    return _operation_view(_visible(operation_id=operation_id, tenant=tenant))


def cancel_operation(*, operation_id: uuid.UUID, tenant: str | None = None,
                     actor: Actor = SYSTEM) -> OperationView:
    """Request cancellation; the cancel is final only once its receipt is accepted."""
    _visible(operation_id=operation_id, tenant=tenant)
    operation_cancel(operation_id=operation_id, actor=actor)
    return get_operation(operation_id=operation_id, tenant=tenant)


def answer_input(
    *, operation_id: uuid.UUID, input_round: int, schema_digest: str, response: dict[str, Any],
    tenant: str | None = None, actor: Actor = SYSTEM,
) -> OperationView:
    """Answer input round `input_round`; the schema digest must match the one the round was opened with."""
    _visible(operation_id=operation_id, tenant=tenant)
    operation_answer_input(
        operation_id=operation_id, input_round=input_round, schema_digest=schema_digest,
        response=response, actor=actor,
    )
    return get_operation(operation_id=operation_id, tenant=tenant)


def resolve_reconciliation_item(
    *, item_id: int, action: str, reason: str, actor: Actor = SYSTEM, tenant: str | None = None,
    remote_id: str = "", terminal_status: str = "", evidence: dict[str, Any] | None = None,
) -> OperationView:
    """Resolve one reconciliation item (attach_remote_id, never_created, accept_terminal,
    abandoned). `accept_terminal` evidence passes the output defense or raises EvidenceRejected."""
    qs = ReconciliationItem.objects.filter(id=item_id)
    if tenant is not None:
        qs = qs.filter(operation__tenant=tenant)
    operation_id = qs.values_list("operation_id", flat=True).first()
    if operation_id is None:
        raise ReconciliationRefused(f"no reconciliation item {item_id}")
    reconciliation_resolve(item_id=item_id, action=action, actor=actor, reason=reason,
                           remote_id=remote_id, terminal_status=terminal_status, evidence=evidence)
    return get_operation(operation_id=operation_id, tenant=tenant)


def list_open_input_requests(*, tenant: str | None = None, limit: int = 100) -> list[InputRequestView]:
    """Open input rounds, oldest deadline first."""
    qs = InputRequest.objects.filter(status=InputRequest.Status.OPEN).order_by("deadline", "id")
    if tenant is not None:
        qs = qs.filter(operation__tenant=tenant)
    return [
        InputRequestView(id=r.pk, operation_id=r.operation_id, round=r.round, method=r.method,
                         params=r.params, schema_digest=r.schema_digest, deadline=r.deadline)
        for r in qs[:limit]
    ]


def consume_outbox(
    *, handler: Callable[..., Any] | str | None = None, limit: int | None = None
) -> RelayStats:
    """Deliver ready outbox events to `handler(*, event, idempotency_key)`; see toolops.services.outbox.

    The handler must apply an event at most once per `idempotency_key` (the receipt id): a relay
    that dies between the handler's success and the mark delivers the event again.
    """
    return outbox_relay(handler=handler, limit=limit)
