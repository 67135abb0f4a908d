"""Appending to the per-operation event series.

Lock order: every append happens after the caller holds the operation row's lock (a conditional
UPDATE or select_for_update in the same transaction). That lock is what makes `max(seq) + 1` safe;
the unique (operation, seq) constraint is the backstop if a caller ever forgets.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.db.models import Max

from ledger.errors import OperationNotFound
from ledger.models import Operation, OperationEvent


def event_append_locked(
    *,
    operation_id: uuid.UUID,
    kind: str,
    execution_epoch: int,
    cancel_generation: int,
    from_state: str = "",
    to_state: str = "",
    server_state: str = "",
    data: Mapping[str, Any] | None = None,
) -> OperationEvent:
    """Append one event; the caller must already hold the row lock in the current transaction."""
    last = OperationEvent.objects.filter(operation_id=operation_id).aggregate(m=Max("seq"))["m"]
    return OperationEvent.objects.create(
        operation_id=operation_id,
        seq=(last or 0) + 1,
        kind=kind,
        from_state=from_state,
        to_state=to_state,
        server_state=server_state,
        execution_epoch=execution_epoch,
        cancel_generation=cancel_generation,
        data=dict(data or {}),
    )


def operation_record_event(
    *, operation_id: uuid.UUID, kind: str, data: Mapping[str, Any] | None = None
) -> OperationEvent:
    """Record an event that changes no state (a refusal, an error, an ignored observation)."""
    with transaction.atomic():
        row = (
            Operation.objects.select_for_update()
            .filter(id=operation_id)
            .values("state", "server_state", "execution_epoch", "cancel_generation")
            .first()
        )
        if row is None:
            raise OperationNotFound(str(operation_id))
        return event_append_locked(
            operation_id=operation_id,
            kind=kind,
            execution_epoch=row["execution_epoch"],
            cancel_generation=row["cancel_generation"],
            from_state=row["state"],
            to_state=row["state"],
            server_state=row["server_state"],
            data=data,
        )
