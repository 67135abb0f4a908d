"""The claim over the due table on PostgreSQL: what it takes (free and due, lapsed lease) and in
what order, what it never takes, its plan, and its write of the operation row (a HOT update);
with real threads, that claims and transitions running at once never deadlock."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta

import factory
import pytest
from django.utils import timezone

from ledger.models import Operation, OperationDue
from ledger.models.operations import SCHEDULED_STATES
from tests.ledger.factories import OperationFactory, ToolServerFactory
from tests.plans import plan_for, plan_generic
from toolops.services.dispatch import CLAIMABLE, operations_claim_due, operations_next_due_at

pytestmark = pytest.mark.django_db(transaction=True)


def _row(*, next_poll_at: datetime | None, lease_expires_at: datetime | None) -> uuid.UUID:
    op = OperationFactory.build(server=ToolServerFactory(), next_poll_at=next_poll_at,
                                lease_expires_at=lease_expires_at,
                                lease_owner="" if lease_expires_at is None else "someone")
    Operation.objects.bulk_create([op])
    return op.id


def _assert_due_mirrors(rows: Iterable[Operation]) -> dict[uuid.UUID, datetime]:
    """Each of these operation rows' due entry is the later of its next poll time and its lease's
    end (the trigger's formula, whichever statement wrote it); returns the entries."""
    entries = dict(OperationDue.objects.values_list("operation_id", "due_at"))
    for op in rows:
        assert entries[op.id] == max(t for t in (op.next_poll_at, op.lease_expires_at) if t), op.id
    return entries


def test_the_claimed_states_are_the_ones_the_due_table_holds() -> None:
    # The due table's triggers are written from SCHEDULED_STATES (the ledger cannot import the
    # dispatcher); a claim over another set would miss rows or find rows it cannot take.
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


def test_rows_are_claimed_in_the_order_they_became_claimable() -> None:
    # A lapsed lease is due at its end: behind rows due before that, ahead of rows due after, so
    # a steady stream of due rows can delay it by its own age at most, never starve it.
    now = timezone.now()
    older = [_row(next_poll_at=now - timedelta(minutes=10 + k), lease_expires_at=None)
             for k in range(3)]
    lapsed = _row(next_poll_at=now - timedelta(minutes=5), lease_expires_at=now - timedelta(minutes=4))
    newer = _row(next_poll_at=now - timedelta(minutes=1), lease_expires_at=None)
    assert operations_claim_due(owner="d", limit=3) == list(reversed(older))
    assert operations_claim_due(owner="d", limit=1) == [lapsed]
    assert operations_claim_due(owner="d", limit=5) == [newer]


@pytest.mark.parametrize(("by_path", "by_servers", "all_due"),
                         [(False, False, False), (True, True, False), (False, False, True)])
def test_the_claims_generic_plan_walks_the_due_index(by_path: bool, by_servers: bool,
                                                     all_due: bool) -> None:
    # Workers prepare their statements: after a few executions PostgreSQL may plan a claim once,
    # without its parameters' values. That plan must still walk the due index in order and reach
    # each operation row and each due entry by its key, never scan either table, also when every
    # row is due (a burst): joined to the batch, the writes were planned as hash joins over
    # both whole tables, dead versions included.
    from django.db import connection

    from toolops.services.dispatch import _claim_sql

    # With table statistics of a ledger in use (on a near-empty table a scan is cheaper).
    when = timezone.now() + (timedelta(seconds=-1) if all_due else timedelta(minutes=5))
    rows = OperationFactory.build_batch(3000, server=ToolServerFactory(), next_poll_at=when)
    Operation.objects.bulk_create(rows, batch_size=1000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE ledger_operation")
        cursor.execute("ANALYZE ledger_operationdue")
    sql = _claim_sql(alias=connection.alias, by_path=by_path, by_servers=by_servers)
    scope_types = [*(["text"] if by_path else []), *(["bigint[]"] if by_servers else [])]
    scope_values = [*(["tasks"] if by_path else []), *([[1]] if by_servers else [])]
    now = timezone.now()
    plan = plan_generic(
        sql, ["text", "timestamptz", *scope_types, "timestamptz", "timestamptz", "int", "text",
              "timestamptz", "timestamptz", "timestamptz"],
        ["o", now, *scope_values, now, now, 200, "o", now, now, now])
    assert "opdue_due_idx" in plan, plan
    assert "Seq Scan on ledger_operation " not in plan, plan
    assert "Seq Scan on ledger_operationdue " not in plan, plan


def test_the_claim_finds_its_candidates_by_the_due_index_never_by_state() -> None:
    # With statistics in which open rows are rare (as on a ledger not yet analyzed, where every
    # condition is estimated at a few rows) the planner took the small index on `state` for the
    # claim's state check, read every open row, joined each to its due entry and sorted them, on
    # every claim. The check is on the candidate, not a way to find it.
    from django.db import connection

    from toolops.services.dispatch import _claim_sql

    server = ToolServerFactory()
    Operation.objects.bulk_create(OperationFactory.build_batch(
        3000, server=server, state="ACCEPTED", next_poll_at=None), batch_size=1000)
    due = [_row(next_poll_at=timezone.now() - timedelta(seconds=1), lease_expires_at=None)
           for _ in range(20)]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE ledger_operation")
        cursor.execute("ANALYZE ledger_operationdue")
    now = timezone.now()
    sql = _claim_sql(alias=connection.alias, by_path=False, by_servers=False)
    plan = plan_for(sql, ["o", now, now, now, 200, "o", now, now, now])
    # Twenty due entries fit one page, which the planner may read whole: either way, from the due
    # table, each operation row by its key.
    assert "on ledger_operationdue d" in plan, plan
    assert "op_state_idx" not in plan and "Seq Scan on ledger_operation " not in plan, plan
    assert sorted(operations_claim_due(owner="d", limit=200)) == sorted(due)


def test_the_claims_write_of_the_operation_row_is_a_hot_update() -> None:
    # The reason for the due table: no index of the wide row holds a column the claim writes, so
    # on a page with room (fillfactor 80) PostgreSQL writes no index entry for the new version.
    from django.db import connection, transaction

    # One row in ten is due, so each page holds only a few of the claimed rows (a claim takes
    # rows in due order, scattered over the table; many new versions of rows of one page within
    # one transaction would fill its free room whatever the indexes).
    server = ToolServerFactory()
    now = timezone.now()
    rows = OperationFactory.build_batch(
        200, server=server, next_poll_at=factory.Iterator(
            [now - timedelta(seconds=1)] + [now + timedelta(minutes=5)] * 9))
    Operation.objects.bulk_create(rows)
    with transaction.atomic(), connection.cursor() as cursor:
        claimed = operations_claim_due(owner="d", limit=50)
        cursor.execute("SELECT pg_stat_get_xact_tuples_updated('ledger_operation'::regclass), "
                       "pg_stat_get_xact_tuples_hot_updated('ledger_operation'::regclass)")
        updated, hot = cursor.fetchone()
    assert len(claimed) == 20
    assert (updated, hot) == (20, 20)


def test_claims_and_transitions_at_once_never_deadlock_or_lease_a_row_twice() -> None:
    # Transitions lock the operation row and then (through the trigger) its due entry; the claim
    # locks operation rows (SKIP LOCKED) and then writes their due entries: one lock order, so
    # no deadlock whatever the interleaving. Real threads, real transactions.
    import threading

    from django.db import connection, transaction

    server = ToolServerFactory()
    now = timezone.now()
    rows = OperationFactory.build_batch(400, server=server, next_poll_at=now - timedelta(seconds=1))
    Operation.objects.bulk_create(rows)
    ids = [r.id for r in rows]
    stop = threading.Event()
    errors: list[BaseException] = []
    leases: dict[str, set[uuid.UUID]] = {}

    def claimer(name: str) -> None:
        try:
            while not stop.is_set():
                got = operations_claim_due(owner=name, limit=25)
                leases.setdefault(name, set()).update(got)
                with transaction.atomic(durable=True):
                    # Hand the rows back due now, as a poll that wrote its next time does.
                    Operation.objects.filter(id__in=got, lease_owner=name).update(
                        lease_owner="", lease_expires_at=None, next_poll_at=timezone.now())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    def transitioner(seed: int) -> None:
        try:
            k = seed
            while not stop.is_set():
                k = (k * 7919 + 13) % len(ids)
                with transaction.atomic(durable=True):
                    op = Operation.objects.select_for_update().get(id=ids[k])
                    Operation.objects.filter(id=op.id).update(
                        next_poll_at=timezone.now() - timedelta(milliseconds=k % 50))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer, args=(f"c{n}",)) for n in range(3)]
    threads += [threading.Thread(target=transitioner, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    time.sleep(3)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert all(leases.values()), "every claimer took rows"
    # The due table still mirrors every row: each claimable now, or leased to its end.
    entries = _assert_due_mirrors(Operation.objects.filter(id__in=ids))
    assert set(entries) == set(ids)


def test_the_next_claimable_time_is_read_per_path_and_per_server() -> None:
    from toolops.services.dispatch import next_claimable_at

    now = timezone.now()
    a, b = ToolServerFactory(), ToolServerFactory()
    early = now - timedelta(minutes=3)
    Operation.objects.bulk_create([
        OperationFactory.build(server=a, next_poll_at=early, executor_path="legacy"),
        OperationFactory.build(server=b, next_poll_at=now - timedelta(minutes=2)),
        OperationFactory.build(server=a, next_poll_at=now - timedelta(minutes=1)),
    ])
    assert next_claimable_at() == early
    assert next_claimable_at(path="tasks") == now - timedelta(minutes=2)
    assert next_claimable_at(server_ids=[b.pk]) == now - timedelta(minutes=2)
    assert next_claimable_at(path="tasks", server_ids=[a.pk]) == now - timedelta(minutes=1)
    assert next_claimable_at(path="legacy", server_ids=[b.pk]) is None
    assert operations_next_due_at(server_ids=[a.pk]) == early


def _due_updates() -> int:
    """Updates of due entries not yet reported to the statistics (this transaction's, and any
    earlier ones' of this session within the last second: here, only inserts came before)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_get_xact_tuples_updated('ledger_operationdue'::regclass)")
        return int(cursor.fetchone()[0])


def test_the_claim_moves_its_rows_due_entries_once_in_its_own_statement() -> None:
    # The claim writes each claimed row's due entry itself, set-based; the row trigger skips that
    # write, so each entry is written once, not twice, and rows not claimed are left alone.
    from django.db import transaction

    now = timezone.now()
    due = [_row(next_poll_at=now - timedelta(seconds=k + 1), lease_expires_at=None) for k in range(6)]
    later = _row(next_poll_at=now + timedelta(minutes=5), lease_expires_at=None)
    with transaction.atomic():
        claimed = operations_claim_due(owner="lease-fresh", limit=4)
        assert _due_updates() == 4
    assert claimed == list(reversed(due))[:4]
    entries = _assert_due_mirrors(Operation.objects.all())
    assert entries[later] == now + timedelta(minutes=5)
    assert {op.lease_owner for op in Operation.objects.filter(id__in=claimed)} == {"lease-fresh"}


def test_the_trigger_skips_only_the_write_that_sets_the_claims_own_owner() -> None:
    # Every other write keeps the trigger: in the claim's transaction, a write that leaves the
    # owner as it is or sets another one, or clears it; and in a later transaction a write that
    # sets the same owner again (the setting is transaction-local).
    from django.db import transaction

    now = timezone.now()
    first = _row(next_poll_at=now - timedelta(seconds=2), lease_expires_at=None)
    other = _row(next_poll_at=now + timedelta(minutes=1), lease_expires_at=None)
    third = _row(next_poll_at=now + timedelta(minutes=2), lease_expires_at=None)
    moved = now + timedelta(minutes=7)
    with transaction.atomic():
        assert operations_claim_due(owner="lease-a", limit=1) == [first]
        Operation.objects.filter(id=first).update(next_poll_at=moved)
        Operation.objects.filter(id=other).update(lease_owner="lease-b",
                                                  lease_expires_at=moved)
        Operation.objects.filter(id=third).update(lease_owner="", next_poll_at=moved)
    with transaction.atomic():
        Operation.objects.filter(id=third).update(lease_owner="lease-a",
                                                  lease_expires_at=moved + timedelta(minutes=1))
    # After a claim's transaction the session's setting is '' (not unknown): releasing a lease,
    # which sets the owner to '', must not match it.
    with transaction.atomic():
        Operation.objects.filter(id=first).update(lease_owner="", lease_expires_at=None,
                                                  next_poll_at=moved + timedelta(minutes=2))
    entries = _assert_due_mirrors(Operation.objects.all())
    assert entries[other] == moved and entries[third] == moved + timedelta(minutes=1)
    assert entries[first] == moved + timedelta(minutes=2)


def test_a_session_that_never_claimed_keeps_the_trigger_for_every_lease_write() -> None:
    # The setting is unknown (NULL) in a fresh session and must not match anything, '' included.
    now = timezone.now()
    row = _row(next_poll_at=now, lease_expires_at=None)
    until = now + timedelta(minutes=3)
    Operation.objects.filter(id=row).update(lease_owner="w", lease_expires_at=until)
    assert OperationDue.objects.get(operation_id=row).due_at == until
    Operation.objects.filter(id=row).update(lease_owner="", lease_expires_at=None)
    assert OperationDue.objects.get(operation_id=row).due_at == now
