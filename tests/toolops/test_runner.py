"""The embedded executor's tick (toolops/runner.py), on PostgreSQL: besides the input deadlines
it refreshes the ledger's statistics once the operation table has outgrown them."""

from __future__ import annotations

import pytest
from django.db import connection

from ledger.services import statistics
from ledger.states import State
from tests.ledger.table_growth import grow_to as _grow_to
from tests.ledger.table_growth import planned_rows as _planned_rows
from toolops.runner import run_embedded

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_embedded_tick_refreshes_the_statistics_of_a_grown_operation_table(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(statistics, "_next_check", 0.0)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE ledger_operation")
    _grow_to(800, state=State.INPUT_REQUIRED)  # waiting on a person: nothing for the loop to poll
    stats = run_embedded(until_idle=True, max_seconds=10)
    assert stats.polls == 0 and stats.tick_errors == 0
    assert _planned_rows() >= 800
