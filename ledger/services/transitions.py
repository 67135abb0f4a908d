"""Guarded state transitions: a compare-and-set UPDATE whose row count is checked.

A transition names the state it read (`from_state`), the execution epoch it works for and, where it
matters, the cancel generation and lease it holds. The UPDATE matches all of them or nothing; zero
rows means someone else moved the row first and the caller's view is stale, so nothing is written.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from django.db import transaction
from django.utils import timezone

from ledger.errors import IllegalTransition, OperationNotFound
from ledger.models import Operation
from ledger.services.events import event_append_locked
from ledger.states import TRANSITIONS, State


def _atomic() -> AbstractContextManager[Any]:
    """A transaction of its own, or the caller's as it is: no savepoint is needed, since a
    guarded UPDATE that matches no row wrote nothing and the refusal is raised before the event."""
    if transaction.get_connection().in_atomic_block:
        return nullcontext()
    return transaction.atomic()


def _event_context(
    *, operation_id: uuid.UUID, fields: Mapping[str, Any], known: Mapping[str, Any] | None
) -> tuple[int, str]:
    """(cancel_generation, server_state) after the UPDATE, for the event row.

    A caller that loaded the row under its lease names them in `known` (the guarded UPDATE just
    proved they still hold), so the common path needs no re-read; a value the UPDATE set from an
    expression is read back.
    """
    values: dict[str, Any] = dict(known or {})
    for name in ("cancel_generation", "server_state"):
        if name in fields:
            values[name] = fields[name]
    if all(name in values and not hasattr(values[name], "resolve_expression")
           for name in ("cancel_generation", "server_state")):
        return int(values["cancel_generation"]), str(values["server_state"])
    row = Operation.objects.filter(id=operation_id).values("cancel_generation", "server_state").get()
    return row["cancel_generation"], row["server_state"]


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
    known: Mapping[str, Any] | None = None,
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
    with _atomic():
        changed = Operation.objects.filter(**filters).update(**fields)
        if changed != 1:
            raise IllegalTransition(
                f"{src} -> {dst} refused for {operation_id}: {_describe_mismatch(operation_id)}"
            )
        generation, server_state = _event_context(operation_id=operation_id, fields=fields, known=known)
        event_append_locked(
            operation_id=operation_id,
            kind=event_kind,
            from_state=src,
            to_state=dst,
            server_state=server_state,
            execution_epoch=execution_epoch,
            cancel_generation=generation,
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
    known: Mapping[str, Any] | None = None,
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
    with _atomic():
        if Operation.objects.filter(**filters).update(**fields) != 1:
            return False
        generation, server_state = _event_context(operation_id=operation_id, fields=fields, known=known)
        event_append_locked(
            operation_id=operation_id,
            kind=event_kind,
            from_state=State(state),
            to_state=State(state),
            server_state=server_state,
            execution_epoch=execution_epoch,
            cancel_generation=generation,
            data=event_data,
        )
    return True
