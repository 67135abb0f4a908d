"""Statistics refresh of the ledger's tables (ledger.services.statistics), on PostgreSQL: a
generic plan cached while the operation table was nearly empty scans it whole; once the table has
grown past its statistics the refresh analyzes it, and the same prepared statement is planned
again by key. Committed rows (the statistics system counts only those), so transactional tests."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from ledger.services import statistics
from ledger.services.statistics import ledger_statistics_refresh_grown
from tests.ledger.table_growth import grow_to as _grow_to
from tests.ledger.table_growth import planned_rows as _planned_rows
from tests.ledger.table_growth import sql_rows as _sql

pytestmark = pytest.mark.django_db(transaction=True)

ROWS = 2000


@pytest.fixture
def by_ids_generic() -> Iterator[None]:
    """A prepared lookup by keys in this session, with its generic plan forced and made now."""
    _sql("SET plan_cache_mode = force_generic_plan")
    _sql("PREPARE by_ids(uuid[]) AS SELECT id FROM ledger_operation WHERE id = ANY($1)")
    yield
    _sql("DEALLOCATE by_ids")
    _sql("RESET plan_cache_mode")


def _plan() -> str:
    return "\n".join(r[0] for r in _sql("EXPLAIN EXECUTE by_ids('{}')"))


@pytest.fixture(autouse=True)
def _fresh_check_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(statistics, "_next_check", 0.0)


def test_a_plan_cached_on_a_nearly_empty_table_is_made_again_once_the_table_has_grown(
        by_ids_generic: None) -> None:
    _sql("ANALYZE ledger_operation")  # empty: the statistics say 0 rows
    assert "Seq Scan on ledger_operation" in _plan()
    _grow_to(ROWS)
    assert "Seq Scan on ledger_operation" in _plan()  # still cached: nothing invalidated it

    assert "ledger_operation" in ledger_statistics_refresh_grown(growth=2.0, min_rows=500)

    assert _planned_rows() >= ROWS
    plan = _plan()
    assert "Seq Scan" not in plan and "ledger_operation_pkey" in plan
    # Grown no further: nothing to do.
    assert ledger_statistics_refresh_grown(growth=2.0, min_rows=500) == []


def test_growth_below_the_threshold_leaves_the_statistics_alone() -> None:
    _sql("ANALYZE ledger_operation")
    _grow_to(300)
    assert ledger_statistics_refresh_grown(growth=2.0, min_rows=500) == []
    assert _planned_rows() == 0
    assert ledger_statistics_refresh_grown(growth=0, min_rows=0) == []  # 0 turns it off


def test_checks_are_spaced_by_the_interval_in_one_process() -> None:
    _sql("ANALYZE ledger_operation")
    _grow_to(600)
    assert ledger_statistics_refresh_grown(growth=2.0, min_rows=1_000_000, min_interval_s=60) == []
    # Now it has grown enough, but the next check is a minute away.
    assert ledger_statistics_refresh_grown(growth=2.0, min_rows=500, min_interval_s=60) == []
    assert _planned_rows() == 0


def test_a_table_someone_else_is_analyzing_is_skipped_without_waiting_or_failing() -> None:
    _sql("ANALYZE ledger_operation")
    _grow_to(600)
    settings = connection.settings_dict
    other = psycopg.connect(host=settings["HOST"] or None, port=settings["PORT"] or None,
                            user=settings["USER"], dbname=settings["NAME"])
    try:
        # What autovacuum or another dispatcher's ANALYZE holds while it works.
        other.execute("LOCK TABLE ledger_operation IN SHARE UPDATE EXCLUSIVE MODE")
        started = time.monotonic()
        assert "ledger_operation" not in ledger_statistics_refresh_grown(growth=2.0, min_rows=500)
        assert time.monotonic() - started < 2
    finally:
        other.rollback()
        other.close()
    assert _planned_rows() == 0
    statistics._next_check = 0.0
    assert "ledger_operation" in ledger_statistics_refresh_grown(growth=2.0, min_rows=500)
