"""Reads of one operation and its rows: lookup by any reference, and the `show` snapshot."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import Q, QuerySet

from ledger.models import (
    EffectReconciliation,
    InputRequest,
    Operation,
    OperationEvent,
    OutboxEvent,
    TerminalReceipt,
)
from ledger.states import OPEN


def operation_get(*, operation_id: uuid.UUID) -> Operation:
    return Operation.objects.select_related("server").get(id=operation_id)


def operation_find(*, ref: str) -> Operation | None:
    """Find an operation by its id, its remote (task) id or its submission key."""
    try:
        as_uuid = uuid.UUID(ref)
    except ValueError:
        as_uuid = None
    q = Q(remote_id=ref) | Q(submission_key=ref)
    if as_uuid is not None:
        q |= Q(id=as_uuid)
    return Operation.objects.select_related("server").filter(q).order_by("created_at").first()


def operation_events(*, operation_id: uuid.UUID) -> QuerySet[OperationEvent]:
    return OperationEvent.objects.filter(operation_id=operation_id).order_by("seq")


def operations_open_count() -> int:
    return Operation.objects.filter(state__in=OPEN).count()


def _field_value(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def operation_snapshot(*, operation_id: uuid.UUID) -> dict[str, Any]:
    """Every ledger field by model name, plus events, receipt and outbox: the `show` contract."""
    op = operation_get(operation_id=operation_id)
    out: dict[str, Any] = {}
    for field in Operation._meta.concrete_fields:
        out[field.attname if field.is_relation else field.name] = _field_value(
            getattr(op, field.attname)
        )
    out["server_name"] = op.server.name
    out["events"] = [
        {
            "seq": e.seq,
            "kind": e.kind,
            "from_state": e.from_state,
            "to_state": e.to_state,
            "server_state": e.server_state,
            "execution_epoch": e.execution_epoch,
            "cancel_generation": e.cancel_generation,
            "data": e.data,
            "created_at": e.created_at.isoformat(),
        }
        for e in operation_events(operation_id=op.id)
    ]
    receipt = TerminalReceipt.objects.filter(operation_id=op.id).first()
    out["receipt"] = (
        None
        if receipt is None
        else {f.attname: _field_value(getattr(receipt, f.attname))
              for f in TerminalReceipt._meta.concrete_fields}
    )
    out["outbox"] = [
        {f.attname: _field_value(getattr(o, f.attname)) for f in OutboxEvent._meta.concrete_fields}
        for o in OutboxEvent.objects.filter(receipt__operation_id=op.id).order_by("id")
    ]
    # Input rounds and late effects (EFFECT_RECONCILIATION_REQUIRED) sit beside the state.
    out["input_requests"] = [
        {f.attname: _field_value(getattr(r, f.attname)) for f in InputRequest._meta.concrete_fields}
        for r in InputRequest.objects.filter(operation_id=op.id).order_by("round")
    ]
    out["effect_reconciliations"] = [
        {f.attname: _field_value(getattr(r, f.attname))
         for f in EffectReconciliation._meta.concrete_fields}
        for r in EffectReconciliation.objects.filter(operation_id=op.id).order_by("id")
    ]
    return out
