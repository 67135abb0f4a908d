"""A new operation and its first event: one statement on PostgreSQL, both rows or neither."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from ledger.models import Operation, OperationEvent
from ledger.services.events import operation_insert_with_first_event
from ledger.states import State
from tests.ledger.factories import OperationFactory, ToolServerFactory


def _new(**overrides: object) -> Operation:
    # An unsaved row as the submit builds it: the factory's values, not written.
    op: Operation = OperationFactory.build(server=ToolServerFactory(), state=State.SUBMITTING,
                                           remote_id="", **overrides)
    return op


@pytest.mark.django_db(transaction=True)
def test_the_row_and_its_first_event_are_one_statement() -> None:
    op = _new()
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        written = operation_insert_with_first_event(op=op, kind="created", data={"mode": "task"})
    assert written is op and op._state.adding is False
    writes = [q["sql"] for q in captured.captured_queries if q["sql"].startswith(("INSERT", "WITH"))]
    assert len(writes) == (1 if connection.vendor == "postgresql" else 2), writes
    stored = Operation.objects.get(id=op.id)
    assert stored.state == State.SUBMITTING and stored.created_at is not None
    event = OperationEvent.objects.get(operation=op)
    assert (event.seq, event.kind, event.from_state, event.to_state, event.data) == (
        1, "created", "", State.SUBMITTING, {"mode": "task"})
    assert (event.execution_epoch, event.cancel_generation) == (op.execution_epoch, op.cancel_generation)


@pytest.mark.django_db(transaction=True)
def test_a_row_that_meets_a_unique_constraint_writes_neither() -> None:
    first = _new()
    operation_insert_with_first_event(op=first, kind="created")
    # The same submission key: skipped, and the transaction goes on (no IntegrityError).
    with transaction.atomic():
        again = _new(submission_key=first.submission_key)
        assert operation_insert_with_first_event(op=again, kind="created") is None
        assert Operation.objects.count() == 1
    assert not Operation.objects.filter(id=again.id).exists()
    assert not OperationEvent.objects.filter(operation_id=again.id).exists()
    assert OperationEvent.objects.filter(operation=first).count() == 1


@pytest.mark.django_db
def test_many_appends_store_what_single_appends_store_for_each_count() -> None:
    from ledger.services.events import EventSpec, event_append_locked, event_append_many_locked

    single, many = OperationFactory(), OperationFactory()
    specs = [EventSpec(kind="a", from_state=State.WORKING, to_state=State.TERMINAL_OBSERVED,
                       data={"status": "completed", "n": [1, None]}),
             EventSpec(kind="b"),
             EventSpec(kind="c", from_state="x", to_state="y", data={"ü": "ß"})]
    with transaction.atomic():
        for spec in specs:
            event_append_locked(operation_id=single.id, kind=spec.kind, from_state=spec.from_state,
                                to_state=spec.to_state, data=spec.data, server_state="completed",
                                execution_epoch=3, cancel_generation=2)
        # One statement per call, with one, two and three events: each count its own text.
        for batch in ([specs[0]], specs[1:], specs):
            with CaptureQueriesContext(connection) as captured:
                written = event_append_many_locked(operation_id=many.id, events=batch,
                                                   server_state="completed", execution_epoch=3,
                                                   cancel_generation=2)
            assert written == len(batch) and len(captured.captured_queries) == 1

    fields = ("seq", "kind", "from_state", "to_state", "server_state", "execution_epoch",
              "cancel_generation", "data")
    stored = list(OperationEvent.objects.filter(operation=many).order_by("seq").values_list(*fields))
    expected = list(OperationEvent.objects.filter(operation=single).order_by("seq")
                    .values_list(*fields))
    assert [row[1:] for row in stored[:3]] == [row[1:] for row in expected]
    assert [row[0] for row in stored] == [1, 2, 3, 4, 5, 6]
    assert [row[1] for row in stored[3:]] == ["a", "b", "c"]
    assert not OperationEvent.objects.filter(operation=many, created_at__isnull=True).exists()
