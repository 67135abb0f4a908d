"""The hot path's reads by key: an operation row with its server by id (every poll, fetch and
resolution loads its row this way, once), a claimed batch of such rows in one statement, a server
by name and whether a submission key is taken (every submit).

Each statement is the ORM's own read (`select_related("server")`, `filter(name=...)`), built once
per database connection with the fields' converters and replayed as SQL: compiling the same query
on every call cost more CPU than its round trip. The instances are built with `Model.from_db`,
exactly as the ORM builds them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections, router
from django.db.models import QuerySet

from ledger.models import Operation, ToolServer
from ledger.statements import statement_spelled

Converter = Callable[[Any, Any, Any], Any]


@dataclass(frozen=True)
class _Compiled:
    sql: str
    op_fields: list[str]
    server_fields: list[str]
    converters: list[tuple[int, list[Converter], Any]]


def _compile(alias: str, *, by: str = "operation") -> _Compiled:
    """The read `by` names ("operation": a row with its server by id; "server": a server by
    name), compiled once per connection alias and vendor."""
    return statement_spelled(site="row_read", shape=(alias, connections[alias].vendor, by),
                             spell=lambda: _read_spelled(alias, by=by))


def _read_spelled(alias: str, *, by: str) -> _Compiled:
    query: QuerySet[Any]
    if by == "server":
        query = ToolServer.objects.using(alias).filter(name="")
        op_fields: list[str] = []
    else:
        query = Operation.objects.using(alias).select_related("server").filter(id=uuid.UUID(int=0))
        op_fields = [f.attname for f in Operation._meta.concrete_fields]
    server_fields = [f.attname for f in ToolServer._meta.concrete_fields]
    compiler = query.query.get_compiler(using=alias)
    sql, _params = compiler.as_sql()
    columns = [col for col, _, _ in compiler.select]
    if len(columns) != len(op_fields) + len(server_fields):
        raise RuntimeError(f"the {by} read does not have the columns its models declare")
    converters = [(i, convs, expr) for i, (convs, expr) in compiler.get_converters(columns).items()]
    return _Compiled(sql=sql, op_fields=op_fields, server_fields=server_fields, converters=converters)


def _fetch_one(alias: str, compiled: _Compiled, params: list[Any]) -> list[Any] | None:
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(compiled.sql, params)
        row = cursor.fetchone()
    return None if row is None else _converted(alias, compiled, row)


def _converted(alias: str, compiled: _Compiled, row: Sequence[Any]) -> list[Any]:
    connection = connections[alias]
    values = list(row)
    for i, convs, expression in compiled.converters:
        for convert in convs:
            values[i] = convert(values[i], expression, connection)
    return values


def server_load(*, name: str) -> ToolServer | None:
    """The server named `name` (as `ToolServer.objects.filter(name=name)` loads it), or None."""
    alias = router.db_for_read(ToolServer)
    compiled = _compile(alias, by="server")
    values = _fetch_one(alias, compiled, [name])
    return None if values is None else ToolServer.from_db(alias, compiled.server_fields, values)


def server_read_sql(*, alias: str) -> tuple[str, int]:
    """`server_load`'s statement (one parameter, the name) and how many columns it selects: for
    a caller that reads more beside the server in the same statement."""
    compiled = _compile(alias, by="server")
    return compiled.sql, len(compiled.server_fields)


def server_from_row(*, alias: str, row: Sequence[Any]) -> ToolServer:
    """The server from the first columns of `row`, as `server_load` builds it from its own."""
    compiled = _compile(alias, by="server")
    values = _converted(alias, compiled, row[: len(compiled.server_fields)])
    return ToolServer.from_db(alias, compiled.server_fields, values)


def operation_load(*, operation_id: uuid.UUID) -> Operation | None:
    """The row and its server (as `select_related("server")` loads them), or None."""
    alias = router.db_for_read(Operation)
    compiled = _compile(alias)
    connection = connections[alias]
    id_value = Operation._meta.pk.get_db_prep_value(operation_id, connection)  # type: ignore[union-attr]
    values = _fetch_one(alias, compiled, [id_value])
    return None if values is None else _operation_built(alias, compiled, values)


def _operation_built(alias: str, compiled: _Compiled, values: list[Any]) -> Operation:
    """The row and its server from one converted result row, as `select_related` builds them."""
    n = len(compiled.op_fields)
    op = Operation.from_db(alias, compiled.op_fields, values[:n])
    op._state.fields_cache["server"] = ToolServer.from_db(alias, compiled.server_fields, values[n:])
    return op


def operation_read_columns(*, alias: str) -> str:
    """The column list of the operation read (the row's columns, then its server's), for a write
    that returns the rows it changed as that read loads them (`UPDATE ... FROM` the server table
    `RETURNING` these): the write and the read in one statement."""
    head, found, _rest = _compile(alias).sql.partition(" FROM ")
    if not found or not head.startswith("SELECT "):
        raise RuntimeError("the operation read is not a plain SELECT ... FROM")
    return head[len("SELECT "):]


def operations_from_rows(*, alias: str, rows: Sequence[Sequence[Any]]) -> dict[uuid.UUID, Operation]:
    """Rows selected with `operation_read_columns`, built as `operations_load` builds its own."""
    compiled = _compile(alias)
    built = (_operation_built(alias, compiled, _converted(alias, compiled, row)) for row in rows)
    return {op.id: op for op in built}


def _batch_sql(alias: str) -> str:
    """The one-row read with the key compared to an array (`= ANY(%s)`, PostgreSQL): one
    statement text, prepared once, whatever the batch's size."""

    def spell() -> str:
        single = _compile(alias).sql
        if not single.endswith(" = %s"):
            raise RuntimeError("the operation read does not end with its key's equality")
        return f"{single[:-len(' = %s')]} = ANY(%s)"

    return statement_spelled(site="row_read_batch", shape=alias, spell=spell)


def operations_load(*, operation_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Operation]:
    """Several rows with their servers, each as `operation_load` builds it, in one statement:
    a batch of claimed rows is read once, not row by row. Ids with no row are absent."""
    if not operation_ids:
        return {}
    alias = router.db_for_read(Operation)
    connection = connections[alias]
    if connection.vendor != "postgresql":
        query = Operation.objects.using(alias).select_related("server")
        return {op.id: op for op in query.filter(id__in=list(operation_ids))}
    with connection.cursor() as cursor:
        cursor.execute(_batch_sql(alias), [list(operation_ids)])
        rows = cursor.fetchall()
    return operations_from_rows(alias=alias, rows=rows)


def operation_submission_key_taken(*, submission_key: str) -> bool:
    """Whether a row holds `submission_key` (as `filter(submission_key=...).exists()` asks),
    answered from the key's unique index."""
    alias = router.db_for_read(Operation)

    def spell() -> str:
        query = Operation.objects.using(alias).filter(submission_key="").values("pk")[:1]
        return str(query.query.get_compiler(using=alias).as_sql()[0])

    sql = statement_spelled(site="submission_key_taken", shape=alias, spell=spell)
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, [submission_key])
        return cursor.fetchone() is not None
