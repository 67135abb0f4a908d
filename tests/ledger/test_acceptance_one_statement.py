"""The acceptance point in one statement: what it writes and what it refuses, including a real
race on the row's lock."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction
from django.utils import timezone

from ledger.models import Operation, OperationEvent, OutboxEvent, TerminalReceipt
from ledger.services.acceptance_one_statement import operation_accept_terminal_one_statement
from ledger.services.events import EventSpec, event_append_locked
from ledger.services.schedule import schedule_cleared
from ledger.states import State
from tests.concurrency import wait_for_lock_waiter
from tests.ledger.factories import OperationFactory

pytestmark = pytest.mark.django_db(transaction=True)

OWNER = "worker-a"
RESULT = {"kind": "result", "payload": {"n": 1}, "is_error": False, "status_message": ""}


def _leased() -> Operation:
    return OperationFactory(state=State.FETCHING_RESULT, terminal_status="completed",
                            lease_owner=OWNER, lease_expires_at=timezone.now() + timedelta(minutes=1))


def _settle(op: Operation, *, events: list[EventSpec] | None = None) -> int | None:
    fields: dict[str, Any] = {"result": RESULT, "result_kind": "result", "result_digest": "sha256:r",
                              "server_state": "completed", **schedule_cleared(),
                              "state": State.ACCEPTED, "updated_at": timezone.now()}
    return operation_accept_terminal_one_statement(
        operation_id=op.id, from_state=State.FETCHING_RESULT, lease_owner=OWNER,
        execution_epoch=op.execution_epoch, cancel_generation=op.cancel_generation,
        call_node_id=op.call_node_id, request_digest=op.request_digest, remote_id=op.remote_id,
        descriptor_version=op.descriptor_version, execution_mode=op.execution_mode,
        fields=fields, accepted_data={"why": "test"},
        events=events if events is not None else [
            EventSpec(kind="result_fetched", from_state=State.FETCHING_RESULT,
                      to_state=State.FETCHING_RESULT, data={"result_digest": "sha256:r"}),
            EventSpec(kind="accepted", from_state=State.FETCHING_RESULT, to_state=State.ACCEPTED,
                      data={"terminal_status": "completed"})])


def test_it_writes_the_row_its_receipt_outbox_row_and_events_in_order() -> None:
    op = _leased()
    receipt_id = _settle(op)
    assert receipt_id is not None
    receipt = TerminalReceipt.objects.get(id=receipt_id)
    assert (receipt.operation_id, receipt.payload, receipt.result_digest) == (op.id, RESULT, "sha256:r")
    assert OutboxEvent.objects.get(receipt_id=receipt_id).payload["payload"] == RESULT
    events = list(OperationEvent.objects.filter(operation_id=op.id).order_by("seq")
                  .values_list("kind", "seq", "data"))
    assert [(kind, seq) for kind, seq, _ in events] == [("result_fetched", 1), ("accepted", 2)]
    assert events[-1][2] == {"terminal_status": "completed", "why": "test", "receipt_id": receipt_id}
    assert Operation.objects.get(id=op.id).state == State.ACCEPTED


def test_the_accepted_event_must_come_last() -> None:
    op = _leased()
    with pytest.raises(ValueError):
        _settle(op, events=[EventSpec(kind="result_fetched", from_state=State.FETCHING_RESULT,
                                      to_state=State.FETCHING_RESULT)])


def test_inside_a_transaction_it_is_not_taken() -> None:
    op = _leased()
    with transaction.atomic():
        assert _settle(op) is None
    assert not TerminalReceipt.objects.exists()


def test_an_event_the_lock_holder_appended_meanwhile_refuses_the_statement() -> None:
    # The previous holder of the row's lock appends an event and commits while the statement
    # waits for the lock: the statement's `max(seq)` comes from the snapshot it took before
    # waiting, so its events would reuse that number; the unique (operation, seq) constraint
    # refuses the whole statement, and nothing of it is written.
    op = _leased()
    locked, release = threading.Event(), threading.Event()

    def holder() -> None:
        try:
            with transaction.atomic():
                Operation.objects.select_for_update().filter(id=op.id).update(
                    server_status_message="still here")
                event_append_locked(operation_id=op.id, kind="note", execution_epoch=op.execution_epoch,
                                    cancel_generation=0, server_state="working")
                locked.set()
                release.wait(timeout=30)
        finally:
            connections.close_all()

    outcome: list[int | None] = []

    def settler() -> None:
        try:
            outcome.append(_settle(op))
        finally:
            connections.close_all()

    first = threading.Thread(target=holder)
    first.start()
    assert locked.wait(timeout=30)
    second = threading.Thread(target=settler)
    second.start()
    assert wait_for_lock_waiter(timeout_s=30), "the settler never waited for the row's lock"
    release.set()
    first.join(timeout=30)
    second.join(timeout=30)
    assert outcome == [None]
    row = Operation.objects.get(id=op.id)
    assert (row.state, row.server_status_message) == (State.FETCHING_RESULT, "still here")
    assert not TerminalReceipt.objects.exists() and not OutboxEvent.objects.exists()
    assert list(OperationEvent.objects.filter(operation_id=op.id).values_list("kind", flat=True)) == ["note"]
    # A later try takes its snapshot after that commit and goes through.
    assert _settle(row) is not None
    assert list(OperationEvent.objects.filter(operation_id=op.id).order_by("seq")
                .values_list("seq", flat=True)) == [1, 2, 3]
