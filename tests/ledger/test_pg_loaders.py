"""`timestamptz` through psycopg's C loader: the same values as Django's own loader, on the
connections it applies to, and never elsewhere."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.backends.postgresql.psycopg_any import register_tzloader

from ledger.pg_loaders import UtcTimestamptzLoader, timestamptz_loader_install
from ledger.states import State
from tests.ledger.factories import OperationFactory

pytestmark = pytest.mark.django_db

TIMESTAMPTZ_OID = 1184
VALUES = [
    "2024-02-29 23:59:59.123456+00",
    "1999-12-31 19:00:00-05",  # shown in the session's zone (UTC) as 2000-01-01 00:00
    "2026-12-04 05:00:00.5+05:30",
    "0001-01-01 00:00:00+00",
    "9999-12-31 23:59:59.999999+00",
    "2026-03-29 01:30:00.000001+00",
]


def _read(query: str, *, django_loader: bool) -> tuple[object, ...]:
    connection.ensure_connection()
    with connection.cursor() as cursor:
        if django_loader:
            register_tzloader(connection.timezone, cursor.cursor)  # Django's own, this cursor only
        cursor.execute(query)
        row = cursor.fetchone()
        assert row is not None
        return tuple(row)


def test_new_connections_read_timestamps_through_the_c_loader() -> None:
    connection.ensure_connection()
    assert connection.connection.adapters.get_loader(TIMESTAMPTZ_OID, 0) is UtcTimestamptzLoader


def test_the_c_loader_reads_what_djangos_loader_reads() -> None:
    query = "SELECT " + ", ".join(f"'{v}'::timestamptz" for v in VALUES) + ", NULL::timestamptz, now()"
    ours = _read(query, django_loader=False)
    theirs = _read(query, django_loader=True)
    assert ours[:-1] == theirs[:-1]
    assert ours[-2] is None
    for value in ours[:-2]:
        assert isinstance(value, datetime) and value.tzinfo is UTC  # the zone object Django sets
    assert ours[1] == datetime(2000, 1, 1, tzinfo=UTC)
    assert ours[0].microsecond == 123456 and ours[4].microsecond == 999999


def test_a_rows_timestamps_round_trip_through_the_orm() -> None:
    at = datetime(2026, 12, 4, 5, 6, 7, 890123, tzinfo=UTC)
    op = OperationFactory(state=State.WORKING, next_poll_at=at, lease_expires_at=at + timedelta(seconds=1))
    op.refresh_from_db()
    assert op.next_poll_at == at and op.next_poll_at.tzinfo is UTC
    assert op.lease_expires_at == at + timedelta(seconds=1)


def test_a_session_not_in_utc_keeps_djangos_loader() -> None:
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SET TIME ZONE 'Europe/Paris'")
    try:
        assert timestamptz_loader_install(connection=connection) is False
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET TIME ZONE 'UTC'")
    assert timestamptz_loader_install(connection=connection) is True
