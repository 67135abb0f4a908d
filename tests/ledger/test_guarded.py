"""The guarded UPDATE with its event in one statement, on the real database (real commits and a
second thread holding the row's lock)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.errors import IllegalTransition
from ledger.models import Operation, OperationEvent
from ledger.services.events import operation_record_event
from ledger.services.guarded import operations_leases_extend
from ledger.services.transitions import operation_transition, operation_update_guarded
from ledger.states import POLLABLE, State
from tests.concurrency import release_once_a_lock_is_awaited
from tests.ledger.factories import OperationFactory
from tests.plans import plan_for, plan_generic

pytestmark = pytest.mark.django_db(transaction=True)


def _leased(**fields: object) -> Operation:
    until = timezone.now() + timedelta(seconds=60)
    return OperationFactory(lease_owner="w1", lease_expires_at=until, next_poll_at=until,
                            state=State.WORKING, server_state="working", **fields)


def _writes(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in captured.captured_queries
            if q["sql"].lstrip().startswith(("UPDATE", "INSERT", "WITH"))]


def _series(op: Operation) -> list[tuple[int, str, str, str, int, str]]:
    return list(OperationEvent.objects.filter(operation=op).order_by("seq").values_list(
        "seq", "kind", "from_state", "to_state", "cancel_generation", "server_state"))


def test_a_transition_of_its_own_is_one_statement_whose_event_reads_the_row() -> None:
    op = _leased(cancel_generation=2)
    operation_record_event(operation_id=op.id, kind="note")
    with CaptureQueriesContext(connection) as captured:
        operation_transition(
            operation_id=op.id, from_state=State.WORKING, to_state=State.TERMINAL_OBSERVED,
            execution_epoch=op.execution_epoch, lease_owner="w1",
            updates={"server_state": "completed"}, event_kind="terminal_observed",
            event_data={"status": "completed"})
    writes = _writes(captured)
    assert len(writes) == 1 and "UPDATE" in writes[0] and "INSERT" in writes[0]
    op.refresh_from_db()
    assert op.state == State.TERMINAL_OBSERVED and op.server_state == "completed"
    # The event takes the generation and the server state the UPDATE left on the row.
    assert _series(op) == [
        (1, "note", "WORKING", "WORKING", 2, "working"),
        (2, "terminal_observed", "WORKING", "TERMINAL_OBSERVED", 2, "completed"),
    ]
    assert OperationEvent.objects.get(operation=op, seq=2).data == {"status": "completed"}


def test_a_write_that_does_not_match_writes_nothing_in_one_statement() -> None:
    op = _leased()
    with CaptureQueriesContext(connection) as captured:
        assert not operation_update_guarded(
            operation_id=op.id, state=State.WORKING, execution_epoch=op.execution_epoch,
            lease_owner="someone-else", updates={"server_status_message": "x"},
            event_kind="status_changed")
        with pytest.raises(IllegalTransition):
            operation_transition(
                operation_id=op.id, from_state=State.WORKING, to_state=State.TERMINAL_OBSERVED,
                execution_epoch=op.execution_epoch + 1, event_kind="terminal_observed")
    assert len(_writes(captured)) == 2
    assert _series(op) == []
    op.refresh_from_db()
    assert op.state == State.WORKING and op.server_status_message == ""


def test_inside_a_callers_transaction_the_update_and_the_event_are_two_statements() -> None:
    op = _leased()
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        assert operation_update_guarded(
            operation_id=op.id, state=State.WORKING, execution_epoch=op.execution_epoch,
            lease_owner="w1", updates={"server_status_message": "halfway"},
            event_kind="status_changed", known={"cancel_generation": 0, "server_state": "working"})
    writes = _writes(captured)
    assert len(writes) == 2 and writes[0].startswith("UPDATE") and writes[1].startswith("INSERT")
    assert [s[1] for s in _series(op)] == ["status_changed"]


def test_an_event_appended_while_the_write_waits_for_the_lock_is_kept_and_the_write_retried() -> None:
    """The one statement's snapshot predates the other appender's commit, so its `max(seq)` misses
    that event and meets the unique constraint; the write is then made as two statements."""
    op = _leased()
    locked, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def appender() -> None:
        try:
            with transaction.atomic():
                operation_record_event(operation_id=op.id, kind="operator_note")
                locked.set()
                # Hold the row's lock until the main thread's statement is waiting on it.
                release.wait(10)
        except BaseException as exc:  # reported to the main thread
            failures.append(exc)
            locked.set()
        finally:
            connection.close()

    thread = threading.Thread(target=appender)
    thread.start()
    assert locked.wait(10)
    # Let the appender commit once the statement below is blocked on the row's lock.
    watcher = threading.Thread(target=release_once_a_lock_is_awaited, args=(release,))
    watcher.start()
    try:
        with CaptureQueriesContext(connection) as captured:
            assert operation_update_guarded(
                operation_id=op.id, state=State.WORKING, execution_epoch=op.execution_epoch,
                lease_owner="w1", updates={"server_status_message": "after the note"},
                event_kind="status_changed")
    finally:
        release.set()
        watcher.join(10)
        thread.join(10)
    assert not failures
    writes = _writes(captured)
    assert writes[0].startswith("WITH") and len(writes) == 3  # the refused statement, then two
    assert [s[:2] for s in _series(op)] == [(1, "operator_note"), (2, "status_changed")]
    op.refresh_from_db()
    assert op.server_status_message == "after the note"


def test_a_guarded_write_reaches_its_row_by_key_whatever_the_statistics() -> None:
    # A guarded write names its row by key; its other guards are checks on that one row. With
    # statistics in which the guarded state is rare (as on a ledger not yet analyzed, where every
    # equality is estimated at one row), the planner priced the small index on `state` below the
    # primary key and walked every row in that state for each write.
    from ledger.services.guarded import guarded_update_statement
    from tests.ledger.factories import ToolServerFactory

    server = ToolServerFactory()
    Operation.objects.bulk_create(OperationFactory.build_batch(
        3000, server=server, state=State.ACCEPTED, next_poll_at=None), batch_size=1000)
    op = _leased(server=server)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE ledger_operation")
    sql, params = guarded_update_statement(
        connection=connection, fields={"server_state": "completed"}, returning=("state",),
        guards={"id": op.id, "state": State.WORKING, "execution_epoch": op.execution_epoch,
                "lease_owner": "w1"})
    for plan in (plan_for(sql, params),
                 plan_generic(sql, ["text", "uuid", "text", "int", "text"], params)):
        assert "ledger_operation_pkey" in plan, plan
        assert "op_state_idx" not in plan, plan
    # The checks still decide: a guard that does not hold writes nothing.
    assert not operation_update_guarded(
        operation_id=op.id, state=State.WORKING, execution_epoch=op.execution_epoch,
        lease_owner="w2", updates={"server_state": "completed"}, event_kind="note")
    assert operation_update_guarded(
        operation_id=op.id, state=State.WORKING, execution_epoch=op.execution_epoch,
        lease_owner="w1", updates={"server_state": "completed"}, event_kind="note")
    op.refresh_from_db()
    assert op.server_state == "completed"


def test_held_leases_are_extended_only_where_still_held() -> None:
    now = timezone.now()
    soon, later = now + timedelta(seconds=5), now + timedelta(seconds=60)
    held = [OperationFactory(lease_owner="w1", lease_expires_at=soon) for _ in range(2)]
    ran_out = OperationFactory(lease_owner="w1", lease_expires_at=now - timedelta(seconds=1))
    taken = OperationFactory(lease_owner="w2", lease_expires_at=soon)
    waiting = OperationFactory(lease_owner="w1", lease_expires_at=soon, state=State.INPUT_REQUIRED)
    everyone = [*held, ran_out, taken, waiting]
    before = {op.id: (op.lease_owner, op.lease_expires_at, op.poll_attempts) for op in everyone}
    with CaptureQueriesContext(connection) as sent:
        extended = operations_leases_extend(ids=[op.id for op in everyone], owner="w1",
                                            until=later, now=now, states=POLLABLE)
    assert set(extended) == {op.id for op in held}
    assert len(sent.captured_queries) == 1
    for op in held:
        op.refresh_from_db()
        assert (op.lease_owner, op.lease_expires_at) == ("w1", later)
        assert op.poll_attempts == before[op.id][2] + 1
        # What it returns is the row as written, with its server, as a read right after gives.
        returned, name = extended[op.id], op.server.name
        with CaptureQueriesContext(connection) as reads:
            assert returned.server.name == name
        assert not reads.captured_queries
        assert {f.attname: getattr(returned, f.attname) for f in Operation._meta.concrete_fields} == \
            {f.attname: getattr(op, f.attname) for f in Operation._meta.concrete_fields}
    for op in (ran_out, taken, waiting):  # never revived, never taken over
        op.refresh_from_db()
        assert (op.lease_owner, op.lease_expires_at, op.poll_attempts) == before[op.id]

