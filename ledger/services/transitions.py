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

from django.db import connections, router, transaction
from django.db.models import F, Field, Value
from django.db.models.expressions import CombinedExpression
from django.utils import timezone

from ledger.errors import IllegalTransition, OperationNotFound
from ledger.models import Operation
from ledger.services.events import EventSpec, event_append_locked, event_append_many_locked
from ledger.statements import statement_spelled
from ledger.states import TRANSITIONS, State
from ledger.values import value_for_db


def _atomic() -> AbstractContextManager[Any]:
    """A transaction of its own, or the caller's as it is: no savepoint is needed, since a
    guarded UPDATE that matches no row wrote nothing and the refusal is raised before the event."""
    if transaction.get_connection().in_atomic_block:
        return nullcontext()
    return transaction.atomic()


_COMPARISONS = {"": "=", "lt": "<", "lte": "<=", "gt": ">", "gte": ">="}


def _column(name: str) -> Field[Any, Any]:
    field = Operation._meta.get_field(name)
    assert isinstance(field, Field)  # a concrete column of the row, never a relation's reverse
    return field


def _increment(value: Any) -> int | None:
    """`F(name) + n` on the same column, the one expression the direct spelling takes."""
    if (isinstance(value, CombinedExpression) and value.connector == "+"
            and isinstance(value.lhs, F) and isinstance(value.rhs, Value)
            and isinstance(value.rhs.value, int)):
        return value.rhs.value
    return None


def _direct(name: str, value: Any) -> bool:
    if hasattr(value, "prepare_database_save"):
        return False  # a model instance: the ORM resolves it
    if hasattr(value, "resolve_expression"):
        return _increment(value) is not None and value.lhs.name == name
    return True


def _guarded_update(*, guards: Mapping[str, Any], fields: Mapping[str, Any],
                    returning: Sequence[str] = ()) -> tuple[int, tuple[Any, ...] | None]:
    """The compare-and-set UPDATE of one row: (rows matched, the `returning` columns or None).

    Spelled directly from the model's columns: plain values, `F(column) + n` on the column itself,
    and guards that compare a column with a value. Compiling the same statement through the ORM
    costs more CPU than its round trip, and every poll cycle writes through here. Anything else
    (another expression, a model instance, a lookup across a relation) goes through the ORM, which
    cannot read columns back.
    """
    meta = Operation._meta
    # A guard on None means IS NULL to the ORM and never matches as `= NULL`: the ORM spells it.
    direct = all(_direct(name, value) for name, value in fields.items()) and all(
        name.partition("__")[2] in _COMPARISONS and value is not None
        for name, value in guards.items())
    if not direct:
        if returning:
            raise ValueError("reading columns back needs a direct UPDATE: plain values and guards")
        return Operation.objects.filter(**guards).update(**fields), None
    connection = connections[router.db_for_write(Operation)]
    params: list[Any] = []
    steps: list[bool] = []
    for name, value in fields.items():
        step = _increment(value)
        steps.append(step is not None)
        params.append(step if step is not None else value_for_db(_column(name), value, connection))
    for key, value in guards.items():
        params.append(_column(key.partition("__")[0]).get_db_prep_value(value, connection))

    def spell() -> str:
        qn = connection.ops.quote_name
        sets = [f"{qn(_column(name).column)} = {qn(_column(name).column)} + %s" if step
                else f"{qn(_column(name).column)} = %s" for name, step in zip(fields, steps, strict=True)]
        where = []
        for key in guards:
            name, _, lookup = key.partition("__")
            where.append(f"{qn(_column(name).column)} {_COMPARISONS[lookup]} %s")
        sql = f"UPDATE {qn(meta.db_table)} SET {', '.join(sets)} WHERE {' AND '.join(where)}"
        if returning:
            sql += f" RETURNING {', '.join(qn(_column(n).column) for n in returning)}"
        return sql

    # The text depends only on the statement's shape (which columns, which are increments, which
    # guards, what is read back); the shapes are the code's own call sites, a few dozen.
    sql = statement_spelled(site="guarded_update", spell=spell, shape=(
        connection.alias, tuple(fields), tuple(steps), tuple(guards), tuple(returning)))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        if returning:
            row = cursor.fetchone()
            return (0, None) if row is None else (1, tuple(row))
        return int(cursor.rowcount), None


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
        changed, _ = _guarded_update(guards=filters, fields=fields)
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
        if _guarded_update(guards=filters, fields=fields)[0] != 1:
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
    at = src
    for hop in hops:
        if hop.to_state != at and hop.to_state not in TRANSITIONS[at]:
            raise IllegalTransition(f"{at} -> {hop.to_state} is not in the state table")
        at = hop.to_state
    if any(hop.event_kind is None for hop in hops[:-1]):
        raise ValueError("only the last hop of a path may leave its event to the caller")
    fields: dict[str, Any] = dict(updates)
    if "state" in fields or "execution_epoch" in fields:
        raise ValueError("state and execution_epoch change only through their own services")
    fields["state"] = at
    fields["updated_at"] = timezone.now()
    read_back = ("cancel_generation", "server_state", *returning)
    guards = {"id": operation_id, "state": src, "execution_epoch": execution_epoch,
              "lease_owner": lease_owner}
    with _atomic():
        _, row = _guarded_update(guards=guards, fields=fields, returning=read_back)
        if row is None:
            raise IllegalTransition(
                f"{src} -> {at} refused for {operation_id}: {_describe_mismatch(operation_id)}"
            )
        values = {name: _column(name).to_python(value)
                  for name, value in zip(read_back, row, strict=True)}
        events, hop_from = [], src
        for hop in hops:
            if hop.event_kind is not None:
                events.append(EventSpec(kind=hop.event_kind, from_state=hop_from,
                                        to_state=hop.to_state, data=hop.event_data))
            hop_from = hop.to_state
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
) -> bool:
    """The guarded UPDATE of operation_update_guarded without its event: for a write that changes
    nothing an operator must see (a poll whose answer is the same as the last: its schedule and
    counters). False, writing nothing, when the row no longer matches."""
    fields: dict[str, Any] = dict(updates)
    if "state" in fields or "execution_epoch" in fields:
        raise ValueError("state and execution_epoch change only through their own services")
    fields["updated_at"] = timezone.now()
    guards: dict[str, Any] = {"id": operation_id, "state": State(state),
                              "execution_epoch": execution_epoch, "lease_owner": lease_owner,
                              **(extra_filters or {})}
    return _guarded_update(guards=guards, fields=fields)[0] == 1
