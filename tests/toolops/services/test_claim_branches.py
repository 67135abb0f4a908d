"""The claim's two branches (free and due, lapsed lease) on PostgreSQL: what each takes, what
neither takes, and that the partial indexes' predicates name the states the claim polls."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from ledger.models import Operation
from ledger.models.operations import SCHEDULED_STATES
from tests.ledger.factories import OperationFactory, ToolServerFactory
from toolops.services.dispatch import CLAIMABLE, operations_claim_due, operations_next_due_at

pytestmark = pytest.mark.django_db(transaction=True)


def _row(*, next_poll_at: datetime | None, lease_expires_at: datetime | None) -> uuid.UUID:
    op = OperationFactory.build(server=ToolServerFactory(), next_poll_at=next_poll_at,
                                lease_expires_at=lease_expires_at,
                                lease_owner="" if lease_expires_at is None else "someone")
    Operation.objects.bulk_create([op])
    return op.id


def test_the_claimed_states_are_the_ones_the_partial_indexes_hold() -> None:
    # The indexes' predicates are written from SCHEDULED_STATES (the ledger cannot import the
    # dispatcher); a claim over another set would no longer be answered from them.
    assert CLAIMABLE == frozenset(SCHEDULED_STATES)


def test_a_row_in_flight_is_skipped_however_early_it_is_due() -> None:
    now = timezone.now()
    in_flight = _row(next_poll_at=now - timedelta(hours=1), lease_expires_at=now + timedelta(minutes=5))
    free = _row(next_poll_at=now - timedelta(seconds=1), lease_expires_at=None)
    assert operations_claim_due(owner="d", limit=10) == [free]
    assert Operation.objects.get(id=in_flight).lease_owner == "someone"
    # Both rows are leased now: the earliest claimable time is the earlier lease's end, not the
    # in-flight row's next poll time an hour ago.
    ends = Operation.objects.filter(id__in=[in_flight, free]).values_list("lease_expires_at", flat=True)
    assert operations_next_due_at() == min(ends)


def test_a_lapsed_lease_is_claimed_with_or_without_a_next_poll_time() -> None:
    now = timezone.now()
    unscheduled = _row(next_poll_at=None, lease_expires_at=now - timedelta(seconds=5))
    due = _row(next_poll_at=now - timedelta(seconds=30), lease_expires_at=now - timedelta(seconds=1))
    later = _row(next_poll_at=now + timedelta(minutes=1), lease_expires_at=now - timedelta(seconds=1))
    assert sorted(operations_claim_due(owner="d", limit=10)) == sorted([unscheduled, due])
    # Its writer asked for a later poll before the lease lapsed: not due before then.
    assert Operation.objects.get(id=later).lease_owner == "someone"


def test_a_lapsed_lease_goes_ahead_of_a_full_batch_of_free_rows() -> None:
    now = timezone.now()
    for k in range(3):
        _row(next_poll_at=now - timedelta(minutes=10 + k), lease_expires_at=None)
    lapsed = _row(next_poll_at=now - timedelta(seconds=1), lease_expires_at=now - timedelta(seconds=1))
    assert operations_claim_due(owner="d", limit=1) == [lapsed]
    assert len(operations_claim_due(owner="d", limit=5)) == 3


@pytest.mark.parametrize(("by_path", "by_servers"), [(False, False), (True, True)])
def test_the_claims_generic_plan_walks_both_partial_indexes(by_path: bool, by_servers: bool) -> None:
    # Workers prepare their statements: after a few executions PostgreSQL may plan a claim once,
    # without its parameters' values. Such a plan can use a partial index only if the statement's
    # own predicate proves the index's, which is why the states are literals in its text.
    from django.db import connection

    from toolops.services.dispatch import _claim_sql

    sql = _claim_sql(alias=connection.alias, by_path=by_path, by_servers=by_servers)
    types = ["text", "timestamptz", "timestamptz", "timestamptz", "timestamptz",
             *(["text"] if by_path else []), *(["bigint[]"] if by_servers else []), "int",
             "timestamptz", *(["text"] if by_path else []), *(["bigint[]"] if by_servers else []),
             "int", "int"]
    numbered = sql
    for i in range(1, len(types) + 1):
        numbered = numbered.replace("%s", f"${i}", 1)
    values = ["'o'", "now()", "now()", "now()", "now()", *(["'embedded'"] if by_path else []),
              *(["ARRAY[1]::bigint[]"] if by_servers else []), "200", "now()",
              *(["'embedded'"] if by_path else []), *(["ARRAY[1]::bigint[]"] if by_servers else []),
              "200", "200"]
    with connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE claim_probe ({', '.join(types)}) AS {numbered}")
        try:
            cursor.execute(f"EXPLAIN EXECUTE claim_probe ({', '.join(values)})")
            plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE claim_probe")
            cursor.execute("RESET plan_cache_mode")
    assert "op_due_free_idx" in plan, plan
    assert "op_leased_idx" in plan, plan
