"""Guarded state transitions: a compare-and-set UPDATE whose row count is checked.

A transition names the state it read (`from_state`), the execution epoch it works for and, where it
matters, the cancel generation and lease it holds. The UPDATE matches all of them or nothing; zero
rows means someone else moved the row first and the caller's view is stale, so nothing is written.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.utils import timezone

from ledger.errors import IllegalTransition, OperationNotFound
from ledger.models import Operation
from ledger.services.events import event_append_locked
from ledger.states import TRANSITIONS, State


def _describe_mismatch(operation_id: uuid.UUID) -> str:
    row = (
        Operation.objects.filter(id=operation_id)
        .values("state", "execution_epoch", "cancel_generation", "lease_owner")
        .first()
    )
    if row is None:
        raise OperationNotFound(str(operation_id))
    return (
        f"row is now state={row['state']} epoch={row['execution_epoch']} "
        f"cancel_generation={row['cancel_generation']} lease={row['lease_owner'] or '-'}"
    )


def operation_transition(
    *,
    operation_id: uuid.UUID,
    from_state: State | str,
    to_state: State | str,
    execution_epoch: int,
    cancel_generation: int | None = None,
    lease_owner: str | None = None,
    updates: Mapping[str, Any] | None = None,
    event_kind: str = "transition",
    event_data: Mapping[str, Any] | None = None,
) -> None:
    """Move one operation from `from_state` to `to_state`, or raise and change nothing."""
    src, dst = State(from_state), State(to_state)
    if dst not in TRANSITIONS[src]:
        raise IllegalTransition(f"{src} -> {dst} is not in the state table")
    fields: dict[str, Any] = dict(updates or {})
    if "state" in fields or "execution_epoch" in fields:
        raise ValueError("state and execution_epoch change only through their own services")
    fields["state"] = dst
    fields["updated_at"] = timezone.now()
    filters: dict[str, Any] = {"id": operation_id, "state": src, "execution_epoch": execution_epoch}
    if cancel_generation is not None:
        filters["cancel_generation"] = cancel_generation
    if lease_owner is not None:
        filters["lease_owner"] = lease_owner
    with transaction.atomic():
        changed = Operation.objects.filter(**filters).update(**fields)
        if changed != 1:
            raise IllegalTransition(
                f"{src} -> {dst} refused for {operation_id}: {_describe_mismatch(operation_id)}"
            )
        row = Operation.objects.filter(id=operation_id).values(
            "cancel_generation", "server_state"
        ).get()
        event_append_locked(
            operation_id=operation_id,
            kind=event_kind,
            from_state=src,
            to_state=dst,
            server_state=row["server_state"],
            execution_epoch=execution_epoch,
            cancel_generation=row["cancel_generation"],
            data=event_data,
        )


def operation_update_guarded(
    *,
    operation_id: uuid.UUID,
    state: State | str,
    execution_epoch: int,
    updates: Mapping[str, Any],
    event_kind: str,
    event_data: Mapping[str, Any] | None = None,
    cancel_generation: int | None = None,
    lease_owner: str | None = None,
    extra_filters: Mapping[str, Any] | None = None,
) -> bool:
    """Write fields without a state change (an observation, a poll schedule), same guards.

    Returns False, writing nothing, when the row no longer matches: the caller's view is stale.
    """
    fields: dict[str, Any] = dict(updates)
    if "state" in fields or "execution_epoch" in fields:
        raise ValueError("state and execution_epoch change only through their own services")
    fields["updated_at"] = timezone.now()
    filters: dict[str, Any] = {"id": operation_id, "state": State(state), "execution_epoch": execution_epoch}
    if cancel_generation is not None:
        filters["cancel_generation"] = cancel_generation
    if lease_owner is not None:
        filters["lease_owner"] = lease_owner
    filters.update(extra_filters or {})
    with transaction.atomic():
        if Operation.objects.filter(**filters).update(**fields) != 1:
            return False
        row = Operation.objects.filter(id=operation_id).values(
            "cancel_generation", "server_state"
        ).get()
        event_append_locked(
            operation_id=operation_id,
            kind=event_kind,
            from_state=State(state),
            to_state=State(state),
            server_state=row["server_state"],
            execution_epoch=execution_epoch,
            cancel_generation=row["cancel_generation"],
            data=event_data,
        )
    return True
