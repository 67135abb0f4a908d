"""The terminal cycle's one write: the status, the result and the final state in one UPDATE,
acceptance in the same transaction; a refusal rolls it back and is recorded step by step."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.models import Operation, OperationEvent, OutboxEvent, TerminalReceipt
from ledger.states import State
from toolops.services.dispatch import operations_claim_due
from toolops.services.observe import operation_poll
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db(transaction=True)


def _poll_until_terminal(op: Operation) -> str:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        time.sleep(0.2)
        Operation.objects.filter(id=op.id).update(next_poll_at=timezone.now() - timedelta(seconds=1))
        owner = f"results-{op.id.hex[:8]}"
        assert operations_claim_due(owner=owner) == [op.id]
        outcome = operation_poll(operation_id=op.id, lease_owner=owner)
        if outcome != "working":
            return outcome
    raise AssertionError("the task never completed")


def _submit(server_name: str, node: str) -> Operation:
    op = operation_submit(server_name=server_name, tool_name="sleep_then_complete",
                          call_node_id=node, arguments={"seconds": 0.3, "value": "ok"})
    assert op.state == State.WORKING
    return op


def test_a_completed_call_is_accepted_with_the_whole_trail_and_no_schedule(server: object) -> None:
    op = _submit(server.name, "one-write-1")  # type: ignore[attr-defined]
    assert _poll_until_terminal(op) == "accepted:completed"
    row = Operation.objects.get(id=op.id)
    assert row.state == State.ACCEPTED and row.terminal_status == "completed" and row.result_digest
    assert row.next_poll_at is None and row.lease_owner == "" and row.lease_expires_at is None
    trail = list(OperationEvent.objects.filter(operation=op).order_by("seq")
                 .values_list("kind", "from_state", "to_state"))
    assert trail[-4:] == [
        ("terminal_observed", "WORKING", "TERMINAL_OBSERVED"),
        ("fetching_result", "TERMINAL_OBSERVED", "FETCHING_RESULT"),
        ("result_fetched", "FETCHING_RESULT", "FETCHING_RESULT"),
        ("accepted", "FETCHING_RESULT", "ACCEPTED"),
    ]
    receipt = TerminalReceipt.objects.get(operation=op)
    accepted = OperationEvent.objects.get(operation=op, kind="accepted")
    assert accepted.data["receipt_id"] == receipt.pk
    assert OutboxEvent.objects.filter(receipt=receipt).count() == 1


def test_the_receipt_its_outbox_row_and_the_trail_are_one_statement_numbered_after_the_series(
        server: object) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    op = _submit(server.name, "one-write-3")  # type: ignore[attr-defined]
    before = OperationEvent.objects.filter(operation=op).count()
    with CaptureQueriesContext(connection) as captured:
        assert _poll_until_terminal(op) == "accepted:completed"
    sql = [q["sql"] for q in captured.captured_queries]
    # A working poll before it may write an event of its own (a changed status message): only
    # the writes from the receipt on are the terminal transaction's.
    first = next(i for i, text in enumerate(sql) if 'INSERT INTO "ledger_terminalreceipt"' in text)
    writes = [text for text in sql[first:] if text.lstrip().startswith(("INSERT", "WITH"))]
    if connection.vendor == "postgresql":
        assert len(writes) == 1 and all(f'INSERT INTO "{t}"' in writes[0] for t in (
            "ledger_terminalreceipt", "ledger_outboxevent", "ledger_operationevent"))
    else:
        assert len(writes) == 3  # the receipt, its outbox row, the events: one each
    events = list(OperationEvent.objects.filter(operation=op).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.kind for e in events[before:]] == [
        "terminal_observed", "fetching_result", "result_fetched", "accepted"]
    receipt = TerminalReceipt.objects.get(operation=op)
    # The key from the statement's own CTE, beside what the separate path writes.
    assert events[-1].data == {"receipt_id": receipt.pk, "terminal_status": "completed"}
    assert events[-1].cancel_generation == 0 and events[-1].execution_epoch == op.execution_epoch
    assert OutboxEvent.objects.get(receipt=receipt).payload["receipt_id"] == receipt.pk
    if connection.vendor == "postgresql":
        # Within what psycopg keeps parsed (above it, it parses the text again on every call).
        from psycopg import _queries

        from ledger.statements import _SPELLED

        text = writes[0]
        spelled = [t for (site, shape), t in _SPELLED.items()
                   if site == "receipt_with_outbox_insert" and shape[-1] == 4]
        assert spelled and all(t.count("%s") <= _queries.MAX_CACHED_STATEMENT_PARAMS
                               and len(t.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH
                               for t in spelled), text


def test_a_refused_acceptance_rolls_the_final_state_back_and_is_recorded(server: object) -> None:
    op = _submit(server.name, "one-write-2")  # type: ignore[attr-defined]
    # Something already holds this call's receipt slot: acceptance must refuse, after the one
    # write has moved the row to ACCEPTED in its transaction.
    TerminalReceipt.objects.create(
        operation=op, call_node_id=op.call_node_id, execution_epoch=op.execution_epoch,
        terminal_status="completed", request_digest=op.request_digest, remote_id=op.remote_id,
        descriptor_version=op.descriptor_version, cancel_generation=op.cancel_generation,
        result_digest="sha256:other")
    assert _poll_until_terminal(op) == "acceptance_refused"
    row = Operation.objects.get(id=op.id)
    # Nothing of the rolled-back write stays but what the step-by-step path wrote again: the
    # status and the result, held in FETCHING_RESULT, and why acceptance refused.
    assert row.state == State.FETCHING_RESULT and row.result_digest and row.terminal_status == "completed"
    kinds = list(OperationEvent.objects.filter(operation=op).order_by("seq").values_list("kind", flat=True))
    assert kinds.count("terminal_observed") == 1 and "accepted" not in kinds
    refused = OperationEvent.objects.get(operation=op, kind="acceptance_refused")
    assert refused.data["field"] == "receipt"
    assert not OutboxEvent.objects.exists()
    assert TerminalReceipt.objects.get(operation=op).result_digest == "sha256:other"
