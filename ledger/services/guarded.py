"""The guarded UPDATE of one operation row, spelled directly from the model's columns, alone or
with its event in one statement (ledger.services.transitions builds every transition on these).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, router, transaction
from django.db.models import F, Field, Value
from django.db.models.expressions import CombinedExpression
from django.utils import timezone

from ledger.flush import flush_deferrable, flush_deferred_condition
from ledger.models import Operation, OperationEvent, ToolServer
from ledger.selectors.rows import operation_read_columns, operations_from_rows, operations_load
from ledger.services.events import EventSpec, event_columns
from ledger.services.schedule import lease_extended
from ledger.statements import statement_spelled
from ledger.values import value_for_db

_COMPARISONS = {"": "=", "lt": "<", "lte": "<=", "gt": ">", "gte": ">="}


def operation_column(name: str) -> Field[Any, Any]:
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


def guarded_update_direct(*, guards: Mapping[str, Any], fields: Mapping[str, Any]) -> bool:
    """Whether the UPDATE can be spelled directly (see guarded_update)."""
    # A guard on None means IS NULL to the ORM and never matches as `= NULL`: the ORM spells it.
    return all(_direct(name, value) for name, value in fields.items()) and all(
        name.partition("__")[2] in _COMPARISONS and value is not None
        for name, value in guards.items())


def guarded_update_statement(*, connection: Any, guards: Mapping[str, Any], fields: Mapping[str, Any],
                      returning: Sequence[str], defer_flush: bool = False) -> tuple[str, list[Any]]:
    """The direct guarded UPDATE's text (kept per shape) and its parameters, for guarded_update
    and for a caller that sends it inside a larger statement (a data-modifying CTE). The caller
    checks that the UPDATE can be spelled directly (guarded_update_direct), and that a statement
    spelled with `defer_flush` is a transaction by itself (ledger.flush)."""
    meta = Operation._meta
    params: list[Any] = []
    steps: list[bool] = []
    for name, value in fields.items():
        step = _increment(value)
        steps.append(step is not None)
        params.append(step if step is not None else value_for_db(operation_column(name), value, connection))
    for key, value in guards.items():
        params.append(operation_column(key.partition("__")[0]).get_db_prep_value(value, connection))

    def spell() -> str:
        qn = connection.ops.quote_name
        cols = [qn(operation_column(name).column) for name in fields]
        sets = [f"{col} = {col} + %s" if step else f"{col} = %s"
                for col, step in zip(cols, steps, strict=True)]
        # The row is named by its key; every other guard is a check on that one row, never a way
        # to find it. On PostgreSQL those checks are spelled so that no index can serve them
        # (`(...) IS TRUE`, the same truth value for a row, NULL included): on a ledger not yet
        # analyzed (a new install, the first minute of a burst) every equality is estimated at
        # one row, and the planner took the small index on `state` over the primary key, then
        # walked every row in that state for each write. A prepared statement keeps such a plan
        # for the session.
        by_key = "id" in guards and connection.vendor == "postgresql"
        where = []
        for key in guards:
            name, _, lookup = key.partition("__")
            check = f"{qn(operation_column(name).column)} {_COMPARISONS[lookup]} %s"
            where.append(f"({check}) IS TRUE" if by_key and key != "id" else check)
        sql = f"UPDATE {qn(meta.db_table)} SET {', '.join(sets)} WHERE {' AND '.join(where)}"
        if defer_flush:
            sql += flush_deferred_condition()
        if returning:
            sql += f" RETURNING {', '.join(qn(operation_column(n).column) for n in returning)}"
        return sql

    # The text depends only on the statement's shape (which columns, which are increments, which
    # guards, what is read back); the shapes are the code's own call sites, a few dozen.
    sql = statement_spelled(site="guarded_update", spell=spell, shape=(
        connection.alias, tuple(fields), tuple(steps), tuple(guards), tuple(returning), defer_flush))
    return sql, params


def guarded_update(*, guards: Mapping[str, Any], fields: Mapping[str, Any],
                    returning: Sequence[str] = (), defer_flush: bool = False,
                    ) -> tuple[int, tuple[Any, ...] | None]:
    """The compare-and-set UPDATE of one row: (rows matched, the `returning` columns or None).

    Spelled directly from the model's columns: plain values, `F(column) + n` on the column itself,
    and guards that compare a column with a value. Compiling the same statement through the ORM
    costs more CPU than its round trip, and every poll cycle writes through here. Anything else
    (another expression, a model instance, a lookup across a relation) goes through the ORM, which
    cannot read columns back.

    `defer_flush`: the write is bookkeeping that is safe to lose in a crash (ledger.flush); where
    the statement is a transaction by itself, its commit does not wait for the WAL flush.
    """
    if not guarded_update_direct(guards=guards, fields=fields):
        if returning:
            raise ValueError("reading columns back needs a direct UPDATE: plain values and guards")
        return Operation.objects.filter(**guards).update(**fields), None
    connection = connections[router.db_for_write(Operation)]
    sql, params = guarded_update_statement(
        connection=connection, guards=guards, fields=fields, returning=returning,
        defer_flush=defer_flush and flush_deferrable(connection=connection))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        if returning:
            row = cursor.fetchone()
            return (0, None) if row is None else (1, tuple(row))
        return int(cursor.rowcount), None


def guarded_update_with_event(
    *, guards: Mapping[str, Any], fields: Mapping[str, Any], event: EventSpec, execution_epoch: int,
) -> bool | None:
    """The guarded UPDATE and its event in ONE statement, a transaction of its own: True
    (both written), False (the row did not match: nothing written), None (not here: the caller
    writes them as two statements).

    The event reads the row's key, generation and server state from the UPDATE (a data-modifying
    CTE), and takes `max(seq) + 1` in the same statement. That read can miss an event: a statement
    that waits for the row's lock keeps the snapshot it took before waiting, so an event appended
    by the holder of the lock meanwhile is not in it, and the INSERT then meets the unique
    (operation, seq) constraint. The statement is refused whole, and the caller writes the two
    statements in a new transaction, whose second statement sees that event. Only a transaction
    of its own can be retried that way: inside a caller's, the caller's transaction would be lost.
    """
    connection = connections[router.db_for_write(Operation)]
    # Outside any transaction, with the connection in autocommit (Django's default), the one
    # statement is a transaction by itself: no BEGIN and COMMIT round trips around it.
    if (connection.vendor != "postgresql" or connection.in_atomic_block
            or not connection.get_autocommit() or not guarded_update_direct(guards=guards, fields=fields)):
        return None
    update_sql, params = guarded_update_statement(
        connection=connection, guards=guards, fields=fields,
        returning=("id", "cancel_generation", "server_state"))
    columns = event_columns()
    own = {"kind": event.kind, "from_state": event.from_state, "to_state": event.to_state,
           "execution_epoch": execution_epoch, "data": dict(event.data or {}),
           "created_at": timezone.now()}
    from_update = {"operation_id": "id", "cancel_generation": "cancel_generation",
                   "server_state": "server_state"}
    params += [value_for_db(f, own[f.attname], connection)
               for f in columns if f.attname not in from_update]

    def spell() -> str:
        qn = connection.ops.quote_name
        table = qn(OperationEvent._meta.db_table)
        picked = [f"u.{qn(from_update[f.attname])}" if f.attname in from_update else "%s"
                  for f in columns]
        return (f"WITH u AS ({update_sql}) INSERT INTO {table} "
                f"({', '.join(qn(f.column) for f in columns)}, {qn('seq')}) "
                f"SELECT {', '.join(picked)}, (SELECT COALESCE(MAX({qn('seq')}), 0) + 1 "
                f"FROM {table} WHERE {qn('operation_id')} = u.{qn('id')}) FROM u")

    sql = statement_spelled(site="guarded_update_with_event", shape=(connection.alias, update_sql),
                            spell=spell)
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return int(cursor.rowcount) == 1
    except IntegrityError as exc:
        if getattr(getattr(exc.__cause__, "diag", None), "constraint_name", "") == "event_seq_unique":
            return None
        raise


def operations_leases_extend(*, ids: Sequence[Any], owner: str, until: datetime, now: datetime,
                             states: Iterable[str], defer_flush: bool = False) -> dict[Any, Operation]:
    """Move the leases of the rows `ids` that `owner` still holds (unexpired at `now`, in one of
    `states`) to `until`, counting one more poll attempt, as a claim would. Returns the rows
    extended, each with its server, as `operations_load` would read them right after.

    A row whose lease ran out or was taken is left as it is, so a lease is never revived. On
    PostgreSQL one statement spelled once (the keys as one array, `= ANY`): the ORM's compiler
    cost about four times the statement's own round trip, and its `IN (...)` made a statement of
    its own for every number of rows. It returns the rows it wrote with their servers (`UPDATE
    ... FROM` the server table `RETURNING` the batch read's columns), so the polls that follow
    need no read of their own: one statement where the renewal and the batch's read were two.
    The other guards are checks on the rows found by key, spelled so that no index can serve them
    (see guarded_update_statement). `defer_flush`: as guarded_update's (a lease renewal lost in a
    crash leaves a shorter lease; the rows are claimed again once it runs out).
    """
    fields = {**lease_extended(until=until), "updated_at": now}
    connection = connections[router.db_for_write(Operation)]
    if connection.vendor != "postgresql":
        # One transaction (on SQLite it takes the write lock first): the rows found are the rows
        # written, with no second pass of the guards.
        with transaction.atomic(using=connection.alias):
            matched = list(Operation.objects.filter(
                id__in=list(ids), lease_owner=owner, lease_expires_at__gt=now, state__in=list(states),
            ).values_list("id", flat=True))
            Operation.objects.filter(id__in=matched).update(**fields, poll_attempts=F("poll_attempts") + 1)
        return operations_load(operation_ids=matched)
    deferred = defer_flush and flush_deferrable(connection=connection)

    def spell() -> str:
        qn = connection.ops.quote_name
        op, server = qn(Operation._meta.db_table), qn(ToolServer._meta.db_table)

        def col(name: str) -> str:
            return f"{op}.{qn(operation_column(name).column)}"

        sets = ", ".join(f"{qn(operation_column(name).column)} = %s" for name in fields)
        attempts = qn(operation_column("poll_attempts").column)
        returning = operation_read_columns(alias=connection.alias)
        # Rows found by key; the server joined by its key (lock order unchanged: the rows'
        # own, as before; the server row is only read).
        return (f"UPDATE {op} SET {sets}, {attempts} = {col('poll_attempts')} + 1 FROM {server} "
                f"WHERE {server}.{qn('id')} = {col('server')} AND {col('id')} = ANY(%s) "
                f"AND ({col('lease_owner')} = %s) IS TRUE AND ({col('lease_expires_at')} > %s) IS TRUE "
                f"AND ({col('state')} = ANY(%s)) IS TRUE"
                f"{flush_deferred_condition() if deferred else ''} RETURNING {returning}")

    sql = statement_spelled(site="operations_leases_extend",
                            shape=(connection.alias, tuple(fields), deferred), spell=spell)
    params = [value_for_db(operation_column(name), value, connection) for name, value in fields.items()]
    params += [list(ids), owner, operation_column("lease_expires_at").get_db_prep_value(now, connection),
               [str(state) for state in states]]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return operations_from_rows(alias=connection.alias, rows=rows)
