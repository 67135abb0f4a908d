"""Guarded state transitions: a compare-and-set UPDATE whose row count is checked.

A transition names the state it read (`from_state`), the execution epoch it works for and, where it
matters, the cancel generation and lease it holds. The UPDATE matches all of them or nothing; zero
rows means someone else moved the row first and the caller's view is stale, so nothing is written.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from ledger.errors import IllegalTransition, OperationNotFound
from ledger.models import Operation
from ledger.services.events import EventSpec, event_append_locked, event_append_many_locked
from ledger.services.guarded import guarded_update, guarded_update_with_event, operation_column
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
    written = guarded_update_with_event(
        guards=filters, fields=fields, execution_epoch=execution_epoch,
        event=EventSpec(kind=event_kind, from_state=src, to_state=dst, data=event_data))
    if written is not None:
        if not written:
            raise IllegalTransition(
                f"{src} -> {dst} refused for {operation_id}: {_describe_mismatch(operation_id)}")
        return
    with _atomic():
        changed, _ = guarded_update(guards=filters, fields=fields)
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
    written = guarded_update_with_event(
        guards=filters, fields=fields, execution_epoch=execution_epoch,
        event=EventSpec(kind=event_kind, from_state=State(state), to_state=State(state),
                        data=event_data))
    if written is not None:
        return written
    with _atomic():
        if guarded_update(guards=filters, fields=fields)[0] != 1:
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


@dataclass(frozen=True)
class Hop:
    """One move of a path (operation_transition_path); to the same state it is an event only.

    `event_kind` None: the move is written without an event of its own, which the caller writes
    later in the same transaction (acceptance's `accepted` event names the receipt, which is
    inserted after the row is locked). Only the last hop may leave its event to the caller."""

    to_state: State
    event_kind: str | None
    event_data: Mapping[str, Any] | None = None


def operation_path_checked(*, from_state: State, hops: Sequence[Hop]) -> tuple[State, list[EventSpec]]:
    """The state a path of hops ends in and the events of its moves, every hop checked against
    the state table (a hop to the state it is in records an event without a move). Only the last
    hop may leave its event to the caller (`event_kind` None). Raises IllegalTransition."""
    at = from_state
    events: list[EventSpec] = []
    for k, hop in enumerate(hops):
        if hop.to_state != at and hop.to_state not in TRANSITIONS[at]:
            raise IllegalTransition(f"{at} -> {hop.to_state} is not in the state table")
        if hop.event_kind is None and k < len(hops) - 1:
            raise ValueError("only the last hop of a path may leave its event to the caller")
        if hop.event_kind is not None:
            events.append(EventSpec(kind=hop.event_kind, from_state=at, to_state=hop.to_state,
                                    data=hop.event_data))
        at = hop.to_state
    return at, events


def operation_transition_path(
    *,
    operation_id: uuid.UUID,
    from_state: State | str,
    hops: Sequence[Hop],
    execution_epoch: int,
    lease_owner: str,
    updates: Mapping[str, Any],
    returning: Sequence[str],
    events_out: list[EventSpec] | None = None,
) -> dict[str, Any]:
    """Several moves of one row in ONE guarded `UPDATE ... RETURNING`, their events in ONE INSERT.

    Each hop must be in the state table (a hop to the state it is in records an event without a
    move); the UPDATE writes the last hop's state and `updates`, guarded like operation_transition
    by the state read, the epoch and the lease. `returning` names plain columns read back from the
    updated row under its new lock, so a caller that decides from them (acceptance checks every
    identity field) needs no second read. Raises IllegalTransition, writing nothing, on a mismatch.
    Runs in the caller's transaction (or its own).

    `events_out`: the hops' events are appended to this list instead of written, for a caller
    that writes them in this same transaction together with its own (acceptance's `accepted`
    event: one INSERT for the whole way to the final state). They carry no epoch, generation or
    server state: those are the row's as read back here, which the caller holds under the lock.
    """
    if events_out is not None and not transaction.get_connection().in_atomic_block:
        # Written "later in this transaction": without one there is no later.
        raise RuntimeError("events_out needs the caller's transaction")
    src = State(from_state)
    at, events = operation_path_checked(from_state=src, hops=hops)
    fields: dict[str, Any] = dict(updates)
    if "state" in fields or "execution_epoch" in fields:
        raise ValueError("state and execution_epoch change only through their own services")
    fields["state"] = at
    fields["updated_at"] = timezone.now()
    read_back = ("cancel_generation", "server_state", *returning)
    guards = {"id": operation_id, "state": src, "execution_epoch": execution_epoch,
              "lease_owner": lease_owner}
    with _atomic():
        _, row = guarded_update(guards=guards, fields=fields, returning=read_back)
        if row is None:
            raise IllegalTransition(
                f"{src} -> {at} refused for {operation_id}: {_describe_mismatch(operation_id)}"
            )
        values = {name: operation_column(name).to_python(value)
                  for name, value in zip(read_back, row, strict=True)}
        if events_out is not None:
            events_out.extend(events)
            return values
        event_append_many_locked(
            operation_id=operation_id, events=events, execution_epoch=execution_epoch,
            cancel_generation=int(values["cancel_generation"]), server_state=str(values["server_state"]),
        )
    return values


def operation_write_guarded(
    *,
    operation_id: uuid.UUID,
    state: State | str,
    execution_epoch: int,
    lease_owner: str,
    updates: Mapping[str, Any],
    extra_filters: Mapping[str, Any] | None = None,
    defer_flush: bool = False,
) -> bool:
    """The guarded UPDATE of operation_update_guarded without its event: for a write that changes
    nothing an operator must see (a poll whose answer is the same as the last: its schedule and
    counters). False, writing nothing, when the row no longer matches. `defer_flush`: see
    guarded_update."""
    fields: dict[str, Any] = dict(updates)
    if "state" in fields or "execution_epoch" in fields:
        raise ValueError("state and execution_epoch change only through their own services")
    fields["updated_at"] = timezone.now()
    guards: dict[str, Any] = {"id": operation_id, "state": State(state),
                              "execution_epoch": execution_epoch, "lease_owner": lease_owner,
                              **(extra_filters or {})}
    return guarded_update(guards=guards, fields=fields, defer_flush=defer_flush)[0] == 1
