"""Commits that skip the wait for their WAL flush, on the real database: which writes do, that the
setting never outlives their own transaction, and that a write inside a caller's transaction
never changes how the caller's commit is made.

Whether a commit waited for its flush is read from `pg_stat_wal.wal_sync` (the WAL flushes made
by the server): a commit that waits flushes the WAL itself; one that does not leaves the flush to
the WAL writer, which makes one flush for many of them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.flush import flush_deferrable, transaction_flush_deferred
from ledger.models import Operation
from ledger.services.guarded import guarded_update, operations_leases_extend
from ledger.states import POLLABLE, State
from tests.ledger.factories import OperationFactory

pytestmark = pytest.mark.django_db(transaction=True)

WRITES = 40


def _wal_syncs() -> int:
    # This backend's own counters reach pg_stat_wal only when it reports them: force that first.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cursor:
        cursor.execute("SELECT wal_sync FROM pg_stat_wal")
        return int(cursor.fetchone()[0])


def _syncs_made_by(write: Callable[[int], None]) -> int:
    before = _wal_syncs()
    for i in range(WRITES):
        write(i)
    return _wal_syncs() - before


def _synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


def _leased() -> Operation:
    until = timezone.now() + timedelta(seconds=60)
    return OperationFactory(lease_owner="w1", lease_expires_at=until, next_poll_at=until,
                            state=State.WORKING, server_state="working")


def _count_write(op: Operation, *, defer_flush: bool) -> Callable[[int], None]:
    def write(i: int) -> None:
        matched, _ = guarded_update(guards={"id": op.id, "lease_owner": "w1"},
                                    fields={"server_status_message": f"poll {i}"},
                                    defer_flush=defer_flush)
        assert matched == 1
    return write


def test_a_deferred_write_of_its_own_does_not_wait_for_the_flush() -> None:
    op = _leased()
    waited = _syncs_made_by(_count_write(op, defer_flush=False))
    deferred = _syncs_made_by(_count_write(op, defer_flush=True))
    # Each waiting commit flushed (another session's flush may cover one now and then).
    assert waited >= WRITES * 3 // 4
    # The WAL writer flushes the deferred ones together, a few times at most in this loop.
    assert deferred <= WRITES // 4
    op.refresh_from_db()
    assert op.server_status_message == f"poll {WRITES - 1}"  # every write landed all the same
    # The setting was the statement's own transaction's: the session still waits for its flushes.
    assert _synchronous_commit() == "on"


def test_inside_a_callers_transaction_a_deferred_write_changes_nothing() -> None:
    op = _leased()
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        assert not flush_deferrable(connection=connection)
        guarded_update(guards={"id": op.id}, fields={"server_status_message": "x"}, defer_flush=True)
        # The caller's commit (which may carry writes that must be durable) still waits.
        assert _synchronous_commit() == "on"
    assert not any("set_config" in q["sql"] for q in captured.captured_queries)


def test_a_transaction_marked_deferred_is_so_until_its_end_only() -> None:
    op = _leased()
    with transaction.atomic():
        assert transaction_flush_deferred(using="default")
        assert _synchronous_commit() == "off"
        guarded_update(guards={"id": op.id}, fields={"server_status_message": "y"})
    assert _synchronous_commit() == "on"
    assert not transaction_flush_deferred(using="default")  # outside any block: nothing to mark


def test_a_deferred_lease_renewal_returns_the_same_rows_and_waits_for_no_flush() -> None:
    ops = [_leased() for _ in range(3)]
    ids = [op.id for op in ops]

    def renew(defer_flush: bool) -> Callable[[int], None]:
        def write(_i: int) -> None:
            now = timezone.now()
            renewed = operations_leases_extend(ids=ids, owner="w1", now=now, states=POLLABLE,
                                               until=now + timedelta(seconds=60),
                                               defer_flush=defer_flush)
            assert set(renewed) == set(ids)
        return write

    waited = _syncs_made_by(renew(False))
    deferred = _syncs_made_by(renew(True))
    assert waited >= WRITES * 3 // 4
    assert deferred <= WRITES // 4
    assert Operation.objects.get(id=ids[0]).poll_attempts == ops[0].poll_attempts + 2 * WRITES
    assert _synchronous_commit() == "on"
