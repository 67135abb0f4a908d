"""One row inserted by one statement spelled directly from its model: the hot path's inserts
(the operation at submit, the receipt and its outbox row at acceptance).

`Model.save()` compiles its INSERT on every call and sends `pre_save`/`post_save`; compiling cost
more CPU than the round trip. The values are prepared exactly as the ORM prepares them
(`pre_save` for `auto_now_add`, `get_db_prep_save` through `ledger/values.py`), and the
database-generated key is read back with RETURNING. If anyone listens to the model's save
signals, the ORM's own save runs instead, so a project that hooks them keeps its hooks.
"""

from __future__ import annotations

from typing import Any, TypeVar, overload

from django.db import IntegrityError, connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model
from django.db.models.fields import AutoFieldMixin
from django.db.models.signals import post_save, pre_save

from ledger.statements import statement_spelled
from ledger.values import value_for_db

M = TypeVar("M", bound=Model)


@overload
def row_insert(instance: M) -> M: ...


@overload
def row_insert(instance: M, *, skip_conflict: bool) -> M | None: ...


def row_insert(instance: M, *, skip_conflict: bool = False) -> M | None:
    """INSERT `instance` (a new row) and return it saved, its key set.

    `skip_conflict`: a row that would break a unique constraint is not inserted and None is
    returned (`ON CONFLICT DO NOTHING`, on PostgreSQL and SQLite alike) instead of raising
    IntegrityError. Inside a transaction that must go on after a refusal this saves the savepoint
    a caught IntegrityError needs (PostgreSQL aborts the transaction on the error); any other
    violation (a CHECK, a foreign key) still raises.
    """
    model = type(instance)
    if pre_save.has_listeners(model) or post_save.has_listeners(model):
        if skip_conflict:
            # The ORM's save has no ON CONFLICT: a savepoint keeps the caller's transaction
            # usable, and any IntegrityError counts as the conflict.
            try:
                with transaction.atomic(using=router.db_for_write(model)):
                    instance.save(force_insert=True)
            except IntegrityError:
                return None
            return instance
        instance.save(force_insert=True)
        return instance
    alias, sql, values, generated = row_insert_statement(instance, skip_conflict=skip_conflict)
    connection = connections[alias]
    pk = model._meta.pk
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        if generated:
            row = cursor.fetchone()
            if row is None:
                return None  # skipped: the conflict left nothing to return
            setattr(instance, pk.attname, row[0])  # type: ignore[union-attr]
        elif skip_conflict and cursor.rowcount == 0:
            return None
    instance._state.adding = False
    instance._state.db = alias
    return instance


def one_statement_pair(first: type[Model], second: type[Model]) -> BaseDatabaseWrapper | None:
    """The connection on which a row of `first` and a row of `second` that reads its key can be
    inserted by one statement (a data-modifying CTE), or None where they must be two.

    One statement needs PostgreSQL, both models written through the same alias, and nobody
    listening to either model's save signals: row_insert gives such a project the ORM's save,
    whose hooks a CTE would skip."""
    connection = connections[router.db_for_write(first)]
    if connection.vendor != "postgresql" or router.db_for_write(second) != connection.alias:
        return None
    if any(signal.has_listeners(model) for signal in (pre_save, post_save)
           for model in (first, second)):
        return None
    return connection


def row_insert_statement(instance: Model, *, skip_conflict: bool = False,
                         only_if: str | None = None) -> tuple[str, str, list[Any], bool]:
    """The INSERT of `instance` as row_insert sends it: (alias, SQL, values, whether the key is
    generated and read back with RETURNING), with the instance's `pre_save` values (timestamps)
    set on it. For a caller that sends it inside a larger statement (a CTE).

    `only_if`: a SQL condition without parameters (naming a CTE of the caller's statement); the
    row is inserted only where it holds (`INSERT ... SELECT <values> WHERE ...`: psycopg sends
    each value typed, so the columns get what VALUES would give them)."""
    model = type(instance)
    alias = router.db_for_write(model)
    connection = connections[alias]
    meta = model._meta
    pk = meta.pk
    generated = isinstance(pk, AutoFieldMixin) and getattr(instance, pk.attname) is None
    fields = [f for f in meta.concrete_fields if not (generated and f is pk)]
    values = [value_for_db(f, f.pre_save(instance, True), connection) for f in fields]

    def spell() -> str:
        qn = connection.ops.quote_name
        placeholders = ", ".join(["%s"] * len(fields))
        rows = f"VALUES ({placeholders})" if only_if is None else (
            f"SELECT {placeholders} WHERE {only_if}")
        sql = f"INSERT INTO {qn(meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) {rows}"
        if skip_conflict:
            sql += " ON CONFLICT DO NOTHING"
        if generated:
            sql += f" RETURNING {qn(pk.column)}"  # type: ignore[union-attr]
        return sql

    # The text depends on the model, the alias, the two switches and the condition only
    # (ledger/statements.py).
    sql = statement_spelled(site="row_insert",
                            shape=(model, alias, generated, skip_conflict, only_if), spell=spell)
    return alias, sql, values, generated
