"""The hot statements' value shortcut gives exactly what the ORM's get_db_prep_save gives."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from django.apps import apps
from django.db import connection, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import ConnectionHandler
from django.utils.functional import lazystr

from ledger.values import value_for_db

# Values of every kind a ledger column is written with, and the near misses a shortcut could get
# wrong: bool for an int column, int for a text column, a lazy string, None.
SAMPLES: list[Any] = [
    None, "", "text", "ünïcode", 0, 1, -5, 2**40, True, False, lazystr("lazy"),
    uuid.UUID(int=7), datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC), {"k": [1, 2]}, 1.5,
]


def _ledger_fields() -> list[models.Field[Any, Any]]:
    return [field for model in apps.get_app_config("ledger").get_models()
            for field in model._meta.concrete_fields]


def _prepared(field: models.Field[Any, Any], value: Any, how: Any) -> tuple[str, Any]:
    """("ok", value) or ("error", exception type): a refusal must be the same refusal."""
    try:
        return "ok", how(field, value)
    except Exception as exc:
        return "error", type(exc)


def _same(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    if a[0] != b[0]:
        return False
    # psycopg's typed integers and JSON wrappers compare by content and type, not identity.
    return type(a[1]) is type(b[1]) and (repr(a[1]) == repr(b[1]) or a[1] == b[1])


def _sqlite() -> BaseDatabaseWrapper:
    """The embedded default's backend: its value adapters differ (plain ints, no typed wrappers);
    preparing values opens no connection."""
    return ConnectionHandler({"default": {"ENGINE": "django.db.backends.sqlite3",
                                          "NAME": ":memory:"}})["default"]


@pytest.mark.django_db
@pytest.mark.parametrize("backend", ["test database", "sqlite"])
def test_every_ledger_column_gets_the_orms_value_for_every_sample(backend: str) -> None:
    db = connection if backend == "test database" else _sqlite()
    fields = _ledger_fields()
    kinds = {type(f) for f in fields}
    # The shortcut's three families all occur in the ledger, so this test exercises them.
    assert {models.CharField, models.TextField, models.BooleanField} <= kinds
    assert kinds & {models.IntegerField, models.BigIntegerField, models.PositiveIntegerField}
    checked = 0
    for field in fields:
        for value in SAMPLES:
            orm = _prepared(field, value, lambda f, v: f.get_db_prep_save(v, db))
            ours = _prepared(field, value, lambda f, v: value_for_db(f, v, db))
            assert _same(orm, ours), (field, value, orm, ours)
            checked += 1
    assert checked == len(fields) * len(SAMPLES)


@pytest.mark.django_db
def test_integers_keep_the_backends_typed_wrapper() -> None:
    field = models.BigIntegerField()
    prepared = value_for_db(field, 5, connection)
    assert type(prepared) is type(field.get_db_prep_save(5, connection))
    if connection.vendor == "postgresql":
        # psycopg 3's Int8: a prepared statement's parameter type depends on it.
        assert type(prepared).__name__ == "Int8"


def test_a_subclass_goes_through_its_own_field() -> None:
    class Upper(models.CharField):  # type: ignore[type-arg]
        def get_prep_value(self, value: Any) -> Any:
            return str(value).upper()

    assert value_for_db(Upper(max_length=5), "abc", connection) == "ABC"
