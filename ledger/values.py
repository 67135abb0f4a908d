"""Column values for the hot statements, prepared as the ORM prepares them, minus its call chain.

`Field.get_db_prep_save` walks four to six methods per value (the expression check, lazy-string
resolution, `to_python`, the backend's adapter), and a submit prepares some seventy values. For the
plain field classes below, and a value already of the field's own Python type, the chain's answer
is known in advance: the value itself, or for integers the backend's integer adapter (on
PostgreSQL, psycopg 3's typed Int2/Int4/Int8, which the prepared statements' parameter types
depend on). Anything else, a subclass included (it may override any step), goes through the field.
tests/ledger/test_values.py holds each shortcut to the ORM's own answer.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field

_TEXT = frozenset({models.CharField, models.TextField})
_INTEGER = frozenset({models.IntegerField, models.BigIntegerField, models.SmallIntegerField,
                      models.PositiveIntegerField, models.PositiveSmallIntegerField,
                      models.PositiveBigIntegerField})


def value_for_db(field: Field[Any, Any], value: Any, connection: BaseDatabaseWrapper) -> Any:
    """`field.get_db_prep_save(value, connection)`, shortcut where its answer is known."""
    kind = type(field)
    if kind in _TEXT:
        # CharField/TextField.to_python returns a str or None as it is.
        if value is None or type(value) is str:
            return value
    elif kind in _INTEGER:
        # bool is an int subclass the ORM turns into 0/1: only an exact int takes the shortcut.
        if value is None:
            return None
        if type(value) is int:
            return connection.ops.adapt_integerfield_value(value, field.get_internal_type())
    elif kind is models.BooleanField:
        # None is refused or kept by the field depending on `null`: the field decides.
        if type(value) is bool:
            return value
    return field.get_db_prep_save(value, connection)


__all__ = ["value_for_db"]
