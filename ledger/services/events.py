"""Appending to the per-operation event series.

Lock order: every append happens after the caller holds the operation row's lock (a conditional
UPDATE or select_for_update in the same transaction). That lock is what makes `max(seq) + 1` safe;
the unique (operation, seq) constraint is the backstop if a caller ever forgets.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections, router, transaction
from django.utils import timezone

from ledger.errors import InsertConditionFailed, OperationNotFound
from ledger.models import Operation, OperationEvent
from ledger.services.inserts import one_statement_pair, row_insert, row_insert_statement
from ledger.statements import statement_spelled
from ledger.values import value_for_db


@functools.cache
def event_columns() -> tuple[Any, ...]:
    """The event's columns an append writes, in model order (the key and `seq` are computed)."""
    return tuple(f for f in OperationEvent._meta.concrete_fields if f.attname not in ("id", "seq"))


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
    """Append one event; the caller must already hold the row lock in the current transaction.

    One statement: the next sequence number is computed inside the INSERT (the row lock makes it
    safe), so an append costs no separate `max(seq)` round trip.
    """
    event = OperationEvent(
        operation_id=operation_id, kind=kind, from_state=from_state, to_state=to_state,
        server_state=server_state, execution_epoch=execution_epoch,
        cancel_generation=cancel_generation, data=dict(data or {}), created_at=timezone.now(),
    )
    connection = connections[router.db_for_write(OperationEvent)]
    columns = event_columns()
    values = [value_for_db(f, getattr(event, f.attname), connection) for f in columns]
    op_id_value = OperationEvent._meta.get_field("operation").get_db_prep_value(operation_id, connection)

    def spell() -> str:
        qn = connection.ops.quote_name
        table = qn(OperationEvent._meta.db_table)
        return (f"INSERT INTO {table} ({', '.join(qn(f.column) for f in columns)}, {qn('seq')}) "
                f"SELECT {', '.join(['%s'] * len(columns))}, COALESCE(MAX({qn('seq')}), 0) + 1 "
                f"FROM {table} WHERE {qn('operation_id')} = %s RETURNING {qn('id')}, {qn('seq')}")

    # The same text on every append: quoting the identifiers each time cost more than the values.
    sql = statement_spelled(site="event_append", shape=connection.alias, spell=spell)
    with connection.cursor() as cursor:
        cursor.execute(sql, [*values, op_id_value])
        event.id, event.seq = cursor.fetchone()
    event._state.adding = False
    event._state.db = connection.alias
    return event


@dataclass(frozen=True)
class EventSpec:
    """One event of a series written together (event_append_many_locked)."""

    kind: str
    from_state: str = ""
    to_state: str = ""
    data: Mapping[str, Any] | None = None


def event_append_many_locked(
    *, operation_id: uuid.UUID, events: Sequence[EventSpec], execution_epoch: int,
    cancel_generation: int, server_state: str = "",
) -> int:
    """Append several events of one row, in order, in ONE statement; same lock rule as
    event_append_locked (the caller holds the row lock in this transaction).

    The rows come from a VALUES list numbered 1..n and take `max(seq) + k`, so their order in the
    series is the order given. Returns how many were written.
    """
    if not events:
        return 0
    connection = connections[router.db_for_write(OperationEvent)]
    params = event_rows_params(
        connection=connection, operation_id=operation_id, events=events,
        execution_epoch=execution_epoch, cancel_generation=cancel_generation,
        server_state=server_state)
    n = len(events)
    # One text per number of events (a path has a handful): spelled once each.
    sql = statement_spelled(site="event_append_many", shape=(connection.alias, n),
                            spell=lambda: event_rows_insert_sql(connection=connection, n=n))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


# The columns every event of one append shares (prepared and sent once) and each event's own.
_SHARED = ("operation_id", "server_state", "execution_epoch", "cancel_generation", "created_at")
_OWN = ("kind", "from_state", "to_state", "data")


def event_rows_params(
    *, connection: Any, operation_id: uuid.UUID, events: Sequence[EventSpec], execution_epoch: int,
    cancel_generation: int, server_state: str,
) -> list[Any]:
    """The parameters of event_rows_insert_sql for `events`: the values they share, once; then
    each event's own and its rank; then the operation's key (for the `max(seq)` read).

    The shared values go once, not per event, so that a statement stays within the parameters
    psycopg keeps its parsed form for (50): above that it parses the text again on every call,
    which cost more than the round trip saved by writing the events with the receipt."""
    columns = {f.attname: f for f in event_columns()}
    shared = {"operation_id": operation_id, "server_state": server_state,
              "execution_epoch": execution_epoch, "cancel_generation": cancel_generation,
              "created_at": timezone.now()}
    params: list[Any] = [value_for_db(columns[name], shared[name], connection) for name in _SHARED]
    for k, spec in enumerate(events, start=1):
        own = {"kind": spec.kind, "from_state": spec.from_state, "to_state": spec.to_state,
               "data": dict(spec.data or {})}
        params += [value_for_db(columns[name], own[name], connection) for name in _OWN]
        params.append(k)
    params.append(OperationEvent._meta.get_field("operation").get_db_prep_value(operation_id,
                                                                                connection))
    return params


def event_rows_insert_sql(*, connection: Any, n: int, last_data_from: tuple[str, str] | None = None,
                          joined: str = "") -> str:
    """The INSERT of `n` events numbered after the row's `max(seq)` (event_rows_params).

    `joined` is a relation the rows are joined with (a CTE of the same statement: no rows there,
    no events), and `last_data_from` = (key, expression) adds `key` with that expression's value
    to the last event's data (the `accepted` event names the receipt its CTE just inserted).
    """
    columns = event_columns()
    if {f.attname for f in columns} != {*_SHARED, *_OWN}:
        raise RuntimeError("the event model's columns changed: update _SHARED and _OWN")
    qn = connection.ops.quote_name
    table = qn(OperationEvent._meta.db_table)
    # VALUES columns are column1..columnN on PostgreSQL and SQLite alike; the rank is last.
    rank = f"v.column{len(_OWN) + 1}"
    picked = {name: f"s.column{i}" for i, name in enumerate(_SHARED, start=1)}
    picked.update({name: f"v.column{i}" for i, name in enumerate(_OWN, start=1)})
    if last_data_from is not None:
        key, expression = last_data_from
        picked["data"] = (f"CASE WHEN {rank} = {n} THEN {picked['data']} || "
                          f"jsonb_build_object('{key}', {expression}) ELSE {picked['data']} END")
    shared_row = f"({', '.join(['%s'] * len(_SHARED))})"
    own_row = f"({', '.join(['%s'] * (len(_OWN) + 1))})"
    return (
        f"INSERT INTO {table} ({', '.join(qn(f.column) for f in columns)}, {qn('seq')}) "
        f"SELECT {', '.join(picked[f.attname] for f in columns)}, m.top + {rank} "
        f"FROM (VALUES {shared_row}) AS s CROSS JOIN (VALUES {', '.join([own_row] * n)}) AS v "
        f"CROSS JOIN (SELECT COALESCE(MAX({qn('seq')}), 0) AS top FROM {table} "
        f"WHERE {qn('operation_id')} = %s) AS m" + (f" CROSS JOIN {joined}" if joined else "")
    )


def operation_record_event(
    *, operation_id: uuid.UUID, kind: str, data: Mapping[str, Any] | None = None
) -> OperationEvent:
    """Record an event that changes no state (a refusal, an error, an ignored observation).

    Inside a caller's transaction it takes no savepoint: nothing here is rolled back on its own
    (a missing row raises before any write), and a database error fails the caller's transaction
    as it would anyway."""
    with transaction.atomic(savepoint=False):
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


# The first event's columns that copy the new row's (event field -> operation field): the event
# records the row as created, in the state it was created in, at the time it was created.
_FIRST_EVENT_FROM_ROW = {"to_state": "state", "server_state": "server_state",
                         "execution_epoch": "execution_epoch",
                         "cancel_generation": "cancel_generation", "created_at": "created_at"}


def operation_insert_with_first_event(
    *, op: Operation, kind: str, data: Mapping[str, Any] | None = None,
    only_if: tuple[str, list[Any]] | None = None,
) -> Operation | None:
    """INSERT a new operation row and its first event (sequence 1, into `op.state`), or neither:
    None when the row met a unique constraint (`ON CONFLICT DO NOTHING`, as
    row_insert(skip_conflict=True)).

    `only_if` (PostgreSQL only): a query and its parameters, run in the same statement first (a
    CTE, so the row locks it takes are held until the statement commits); the rows are inserted
    only if it returns a row, and InsertConditionFailed is raised, nothing written, if it returns
    none.

    On PostgreSQL one statement: the event's INSERT reads the operation's from a data-modifying
    CTE, so a skipped row writes no event. The sequence number is 1 without a read: the row is
    new, and no other transaction can append to it before this one commits (its key is unknown
    until then and its row lock is this statement's). Elsewhere (SQLite, or a project listening
    to the models' save signals) the same two writes as two statements."""
    connection = one_statement_pair(Operation, OperationEvent)
    if connection is None:
        if only_if is not None:
            raise ValueError("a conditional insert needs one statement (PostgreSQL)")
        inserted = row_insert(op, skip_conflict=True)
        if inserted is not None:
            event_append_locked(operation_id=op.id, kind=kind, to_state=op.state,
                                server_state=op.server_state, execution_epoch=op.execution_epoch,
                                cancel_generation=op.cancel_generation, data=data)
        return inserted
    guard_sql, guard_params = only_if if only_if is not None else (None, [])
    alias, op_sql, op_values, generated = row_insert_statement(
        op, skip_conflict=True, only_if=None if guard_sql is None else "EXISTS (SELECT 1 FROM g)")
    assert not generated  # the operation's key is a UUID chosen here, never the database's
    columns = [f for f in event_columns() if f.attname != "operation_id"]
    # The event's copies of the row's own values are read from the row as inserted, not sent
    # again: the statement stays within psycopg's 50 parameters, above which it is parsed anew
    # on every execution instead of kept (MAX_CACHED_STATEMENT_PARAMS).
    given = {"kind": kind, "from_state": "", "data": dict(data or {})}
    values = [value_for_db(f, given[f.attname], connection)
              for f in columns if f.attname not in _FIRST_EVENT_FROM_ROW]
    meta = Operation._meta

    def spell() -> str:
        qn = connection.ops.quote_name
        pk = qn(meta.pk.column)  # type: ignore[union-attr]
        copied = {attname: qn(meta.get_field(name).column)  # type: ignore[union-attr,arg-type]
                  for attname, name in _FIRST_EVENT_FROM_ROW.items()}
        event_columns = [OperationEvent._meta.get_field("operation").column, *(f.column for f in columns)]
        selected = ", ".join(f"o.{copied[f.attname]}" if f.attname in copied else "%s"
                             for f in columns)
        event_insert = (f"INSERT INTO {qn(OperationEvent._meta.db_table)} "
                        f"({', '.join(qn(c) for c in event_columns)}, {qn('seq')}) "
                        f"SELECT o.{pk}, {selected}, 1 FROM o "
                        f"RETURNING {qn('id')}")
        returning = ", ".join([pk, *sorted(set(copied.values()))])
        if guard_sql is None:
            return f"WITH o AS ({op_sql} RETURNING {returning}) {event_insert}"
        # One row always: whether the condition held, and whether the rows were written.
        return (f"WITH g AS ({guard_sql}), o AS ({op_sql} RETURNING {returning}), "
                f"e AS ({event_insert}) "
                f"SELECT EXISTS (SELECT 1 FROM g), EXISTS (SELECT 1 FROM e)")

    sql = statement_spelled(site="operation_insert_with_first_event",
                            shape=(alias, op_sql, guard_sql), spell=spell)
    with connection.cursor() as cursor:
        cursor.execute(sql, [*guard_params, *op_values, *values])
        row = cursor.fetchone()
    if guard_sql is not None:
        assert row is not None
        if not row[0]:
            raise InsertConditionFailed("the insert's condition did not hold: nothing written")
        row = row if row[1] else None
    if row is None:
        return None  # the operation met a unique constraint: neither row was written
    op._state.adding = False
    op._state.db = alias
    return op
