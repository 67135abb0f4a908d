"""The common end of a poll cycle: one statement where it may, the transaction otherwise, and
the same rows either way. Against PostgreSQL, with real commits and real threads."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from adapters.base import FetchedResult, RemoteTask
from ledger.models import Operation, OperationEvent, OutboxEvent, TerminalReceipt
from ledger.states import State
from tests.concurrency import race_at_once
from tests.ledger.factories import OperationFactory
from toolops.services.settle_cycle import (
    CyclePlan,
    Seen,
    cycle_plan,
    cycle_settle_in_transaction,
    cycle_settle_one_statement,
)

pytestmark = pytest.mark.django_db(transaction=True)

OWNER = "worker-a"
FETCHED = FetchedResult(kind="result", payload={"content": [{"type": "text", "text": "ok"}]},
                        is_error=False, raw={})


def _leased(**overrides: Any) -> Operation:
    fields: dict[str, Any] = {"lease_owner": OWNER,
                              "lease_expires_at": timezone.now() + timedelta(minutes=1)}
    fields.update(overrides)
    return OperationFactory(**fields)


def _seen(op: Operation, status: str = "completed") -> Seen:
    task = RemoteTask(remote_id=op.remote_id, status=status, status_message="done",
                      poll_interval_ms=500, ttl_ms=60_000, created_at=None, raw={})
    return Seen(task=task, from_state=State.WORKING, observation_seq=3)


def _plan(op: Operation, seen: Seen) -> CyclePlan:
    plan, verdict = cycle_plan(op=op, seen=seen, fetched=FETCHED)
    assert plan is not None, verdict
    return plan


def _one_statement(op: Operation, status: str = "completed") -> str | None:
    seen = _seen(op, status)
    return cycle_settle_one_statement(op=op, lease_owner=OWNER, seen=seen, plan=_plan(op, seen))


def _written(op: Operation) -> dict[str, Any]:
    """What a settle wrote for `op`, without keys, times and what names the row itself."""
    row = Operation.objects.filter(id=op.id).values().get()
    for name in ("id", "call_node_id", "submission_key", "remote_id", "request_digest",
                 "updated_at", "created_at", "body"):
        row.pop(name)
    receipt = TerminalReceipt.objects.filter(operation_id=op.id).values().get()
    receipt_id = receipt.pop("id")
    for name in ("operation_id", "accepted_at", "call_node_id", "remote_id", "request_digest"):
        receipt.pop(name)
    outbox = OutboxEvent.objects.filter(receipt_id=receipt_id).values().get()
    assert outbox["payload"].pop("receipt_id") == receipt_id
    assert outbox["payload"].pop("operation_id") == str(op.id)
    assert outbox["payload"].pop("call_node_id") == op.call_node_id
    for name in ("id", "receipt_id", "created_at"):
        outbox.pop(name)
    events = []
    for event in OperationEvent.objects.filter(operation_id=op.id).order_by("seq").values():
        if event["kind"] == "accepted":
            assert event["data"].pop("receipt_id") == receipt_id
        events.append({k: v for k, v in event.items() if k not in ("id", "operation_id", "created_at")})
    return {"row": row, "receipt": receipt, "outbox": outbox, "events": events}


def test_the_one_statement_writes_what_the_transaction_writes() -> None:
    one = _leased()
    other = _leased(server=one.server)
    with CaptureQueriesContext(connection) as sent:
        outcome = _one_statement(one)
    assert outcome == "accepted:completed"
    # One statement, no BEGIN or COMMIT around it.
    assert len(sent.captured_queries) == 1, [q["sql"][:80] for q in sent.captured_queries]
    assert one.state == State.ACCEPTED and one.lease_owner == ""
    with transaction.atomic(durable=True):
        seen = _seen(other)
        assert cycle_settle_in_transaction(op=other, lease_owner=OWNER, seen=seen,
                                           plan=_plan(other, seen)) == "accepted:completed"
    written_one, written_other = _written(one), _written(other)
    for part in ("row", "receipt", "outbox"):
        differ = {name: (value, written_other[part][name])
                  for name, value in written_one[part].items() if value != written_other[part][name]}
        assert not differ, (part, differ)
    assert written_one["events"] == written_other["events"]
    assert [e["kind"] for e in written_one["events"]] == [
        "terminal_observed", "fetching_result", "result_fetched", "accepted"]
    assert written_one["row"]["state"] == State.ACCEPTED


@pytest.mark.parametrize("field, value", [
    ("lease_owner", "worker-b"),            # the lease moved on
    ("request_digest", "sha256:other"),     # not the request this worker loaded
    ("descriptor_version", "sha256:d2"),
    ("execution_epoch", 2),
    ("cancel_generation", 1),               # a cancel was requested since the load
    ("state", State.CANCEL_REQUESTED),
])
def test_a_row_that_is_not_the_claim_is_left_as_it_was(field: str, value: Any) -> None:
    op = _leased()
    loaded = Operation.objects.get(id=op.id)
    Operation.objects.filter(id=op.id).update(**{field: value})
    before = Operation.objects.filter(id=op.id).values().get()
    events = OperationEvent.objects.filter(operation_id=op.id).count()
    assert _one_statement(loaded) is None
    assert Operation.objects.filter(id=op.id).values().get() == before
    assert OperationEvent.objects.filter(operation_id=op.id).count() == events
    assert not TerminalReceipt.objects.filter(operation_id=op.id).exists()
    assert not OutboxEvent.objects.exists()


def test_a_taken_receipt_slot_refuses_the_whole_statement() -> None:
    # An earlier attempt of the same call node and epoch, settled as never created, holds the
    # receipt slot: the statement's receipt INSERT meets the unique constraint.
    op = _leased()
    earlier = OperationFactory(call_node_id=op.call_node_id, state=State.NOT_FOUND_SAFE,
                               next_poll_at=None, terminal_status="failed")
    TerminalReceipt.objects.create(
        operation=earlier, tenant=op.tenant, call_node_id=op.call_node_id,
        execution_epoch=op.execution_epoch, terminal_status="failed",
        request_digest=op.request_digest, remote_id="", descriptor_version=op.descriptor_version,
        cancel_generation=0, result_digest="")
    before = Operation.objects.filter(id=op.id).values().get()
    assert _one_statement(op) is None
    assert Operation.objects.filter(id=op.id).values().get() == before
    assert not OperationEvent.objects.filter(operation_id=op.id, kind="accepted").exists()
    assert not OutboxEvent.objects.exists()


@pytest.mark.parametrize("overrides, status", [
    ({"cancel_generation": 1}, "completed"),   # the accepted event carries the cancel figures
    ({"input_round": 1}, "completed"),         # open rounds are withdrawn with the receipt
    ({"execution_mode": "sync"}, "completed"),  # a synchronous call may have shadows to compare
    ({}, "cancelled"),                         # no payload: the late result goes to the audit
])
def test_rows_with_more_to_accept_are_left_to_the_transaction(overrides: dict[str, Any],
                                                              status: str) -> None:
    op = _leased(**overrides)
    with CaptureQueriesContext(connection) as sent:
        assert _one_statement(op, status) is None
    assert sent.captured_queries == []


def test_inside_a_transaction_it_writes_nothing_and_says_so() -> None:
    op = _leased()
    with transaction.atomic():
        assert _one_statement(op) is None
    assert Operation.objects.get(id=op.id).state == State.WORKING


def test_two_workers_settling_one_row_at_once_write_one_receipt() -> None:
    # Both loaded the row under the same lease (a worker and its own retry): each sends the one
    # statement on its own connection at the same moment; the row's lock lets one through, and
    # the other's guards then fail on the row it waited for.
    op = _leased()
    def settle() -> str | None:
        mine = Operation.objects.get(id=op.id)
        return _one_statement(mine)

    outcomes, errors = race_at_once(2, settle)
    assert not errors, errors
    assert sorted(map(str, outcomes)) == ["None", "accepted:completed"]
    assert TerminalReceipt.objects.filter(operation_id=op.id).count() == 1
    assert OutboxEvent.objects.count() == 1
    assert OperationEvent.objects.filter(operation_id=op.id, kind="accepted").count() == 1
