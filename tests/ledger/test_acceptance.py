"""The one acceptance point, including real concurrent transactions on PostgreSQL."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from ledger.errors import AcceptanceRefused
from ledger.models import InputRequest, Operation, OperationEvent, OutboxEvent, TerminalReceipt
from ledger.services.acceptance import operation_accept_terminal
from ledger.states import State
from tests.concurrency import race_at_once
from tests.ledger.factories import OperationFactory

RESULT = {"kind": "result", "payload": {"content": [{"type": "text", "text": "ok"}]},
          "is_error": False, "status_message": ""}


def _fetched_op(**overrides: Any) -> Operation:
    fields: dict[str, Any] = {
        "state": State.FETCHING_RESULT, "terminal_status": "completed", "server_state": "completed",
        "result": RESULT, "result_kind": "result", "result_digest": "sha256:abc",
    }
    fields.update(overrides)
    return OperationFactory(**fields)


def _claim(op: Operation, **overrides: Any) -> dict[str, Any]:
    claim = {
        "operation_id": op.id, "call_node_id": op.call_node_id, "request_digest": op.request_digest,
        "remote_id": op.remote_id, "descriptor_version": op.descriptor_version,
        "execution_epoch": op.execution_epoch, "cancel_generation": op.cancel_generation,
        "terminal_status": op.terminal_status, "result_digest": op.result_digest,
    }
    claim.update(overrides)
    return claim


@pytest.mark.django_db
def test_accept_writes_receipt_one_outbox_row_and_final_state() -> None:
    op = _fetched_op()
    receipt = operation_accept_terminal(**_claim(op))
    op.refresh_from_db()
    assert op.state == State.ACCEPTED
    assert receipt.payload == RESULT and receipt.terminal_status == "completed"
    outbox = OutboxEvent.objects.get(receipt=receipt)
    assert outbox.payload["operation_id"] == str(op.id)
    assert outbox.payload["receipt_id"] == receipt.pk
    assert OperationEvent.objects.filter(operation=op, kind="accepted").count() == 1


@pytest.mark.django_db
def test_acceptance_withdraws_open_input_rounds_in_the_same_transaction() -> None:
    op = _fetched_op()
    answered = InputRequest.objects.create(
        operation=op, round=1, server_request_id="r1", method="elicitation/create",
        schema_digest="sha256:s", deadline=timezone.now(), status=InputRequest.Status.ANSWERED)
    open_round = InputRequest.objects.create(
        operation=op, round=2, server_request_id="r2", method="elicitation/create",
        schema_digest="sha256:s", deadline=timezone.now())
    # As the input service does: a round is opened with the row's `input_round` bump.
    Operation.objects.filter(id=op.id).update(input_round=2)
    operation_accept_terminal(**_claim(op))
    open_round.refresh_from_db()
    answered.refresh_from_db()
    # An accepted row takes no more answers; a round already answered keeps its record.
    assert open_round.status == InputRequest.Status.WITHDRAWN
    assert answered.status == InputRequest.Status.ANSWERED


@pytest.mark.django_db
def test_an_operator_settled_cancel_is_marked_in_the_accepted_event() -> None:
    op = _fetched_op(cancel_generation=1, result_kind="attested")
    OperationEvent.objects.create(operation=op, seq=1, kind="cancel_requested", cancel_generation=1,
                                  execution_epoch=op.execution_epoch)
    operation_accept_terminal(**_claim(op))
    data = OperationEvent.objects.get(operation=op, kind="accepted").data
    assert data["settled_by"] == "operator" and data["cancel_outcome"] == "lost"
    assert data["cancel_confirmation_ms"] >= 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    "field,value",
    [
        ("call_node_id", "another-node"),
        ("request_digest", "sha256:other"),
        ("remote_id", "another-task"),
        ("descriptor_version", "sha256:older-descriptor"),
        ("execution_epoch", 0),
        ("cancel_generation", 1),
        ("terminal_status", "failed"),
        ("result_digest", "sha256:tampered"),
    ],
)
def test_each_identity_mismatch_is_refused_and_logged(field: str, value: Any) -> None:
    op = _fetched_op()
    with pytest.raises(AcceptanceRefused) as err:
        operation_accept_terminal(**_claim(op, **{field: value}))
    assert err.value.field == field
    op.refresh_from_db()
    assert op.state == State.FETCHING_RESULT
    assert not TerminalReceipt.objects.exists() and not OutboxEvent.objects.exists()
    refusal = OperationEvent.objects.get(operation=op, kind="acceptance_refused")
    assert refusal.data["field"] == field


@pytest.mark.django_db
def test_completed_without_fetched_result_is_refused() -> None:
    op = _fetched_op(result=None, result_digest="")
    with pytest.raises(AcceptanceRefused, match="not fetched"):
        operation_accept_terminal(**_claim(op))
    op = OperationFactory(state=State.TERMINAL_OBSERVED, terminal_status="completed")
    with pytest.raises(AcceptanceRefused, match="cannot be accepted"):
        operation_accept_terminal(**_claim(op))
    assert not TerminalReceipt.objects.exists()


@pytest.mark.django_db
def test_confirmed_cancel_is_accepted_without_success_payload() -> None:
    op = OperationFactory(state=State.CANCEL_REQUESTED, cancel_generation=1)
    receipt = operation_accept_terminal(**_claim(op, terminal_status="cancelled", result_digest=""))
    op.refresh_from_db()
    assert op.state == State.CANCELLED_ACCEPTED
    assert receipt.payload is None and receipt.terminal_status == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_eight_threads_accepting_at_once_yield_one_receipt() -> None:
    assert connection.vendor == "postgresql", "the race test needs real row locks"
    op = _fetched_op()
    claim = _claim(op)
    results, errors = race_at_once(8, lambda: operation_accept_terminal(**claim))
    assert len(results) == 1, errors
    assert len(errors) == 7 and all(isinstance(e, AcceptanceRefused) for e in errors), errors
    assert TerminalReceipt.objects.filter(call_node_id=op.call_node_id).count() == 1
    assert OutboxEvent.objects.count() == 1
    assert OperationEvent.objects.filter(operation=op, kind="acceptance_refused").count() == 7


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("field,value", [("result_digest", "sha256:other"),
                                         ("execution_epoch", 0), ("cancel_generation", 1)])
def test_eight_threads_with_mismatched_claims_are_all_refused(field: str, value: Any) -> None:
    assert connection.vendor == "postgresql"
    op = _fetched_op()
    claim = _claim(op, **{field: value})
    results, errors = race_at_once(8, lambda: operation_accept_terminal(**claim))
    assert results == []
    assert len(errors) == 8 and all(isinstance(e, AcceptanceRefused) for e in errors)
    assert not TerminalReceipt.objects.exists() and not OutboxEvent.objects.exists()
    op.refresh_from_db()
    assert op.state == State.FETCHING_RESULT


@pytest.mark.django_db(transaction=True)
def test_two_operations_of_one_call_node_cannot_both_be_accepted() -> None:
    """Two live attempts of one call node and epoch cannot even exist (a database constraint), so two
    receipts are impossible; the receipt constraint stays as the backstop behind it."""
    first = _fetched_op(call_node_id="node-x")
    with pytest.raises(IntegrityError), transaction.atomic():
        _fetched_op(call_node_id="node-x")
    # A NOT_FOUND_SAFE attempt (proven never created) does not hold the call node.
    OperationFactory(call_node_id="node-y", state=State.NOT_FOUND_SAFE, remote_id="")
    second = _fetched_op(call_node_id="node-y")
    for op in (first, second):
        operation_accept_terminal(**_claim(op))
    assert TerminalReceipt.objects.filter(call_node_id="node-x").count() == 1
    assert TerminalReceipt.objects.filter(call_node_id="node-y").count() == 1
    assert OutboxEvent.objects.count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["working", "input_required", "paused"])
def test_a_status_that_is_not_terminal_is_never_accepted(status: str) -> None:
    # From CANCEL_REQUESTED the claim is not compared with a recorded status, so the check on
    # the status itself is what refuses it.
    op = OperationFactory(state=State.CANCEL_REQUESTED, server_state=status, remote_id="t-1")
    with pytest.raises(AcceptanceRefused) as refused:
        operation_accept_terminal(**_claim(op, terminal_status=status))
    assert refused.value.field == "terminal_status"
    assert not TerminalReceipt.objects.filter(operation=op).exists()
    op.refresh_from_db()
    assert op.state == State.CANCEL_REQUESTED


@pytest.mark.django_db(transaction=True)
def test_the_database_refuses_a_status_that_is_not_terminal_on_a_row_or_a_receipt() -> None:
    op = _fetched_op()
    with pytest.raises(IntegrityError), transaction.atomic():
        Operation.objects.filter(id=op.id).update(terminal_status="working")
    receipt = operation_accept_terminal(**_claim(op))
    with pytest.raises(IntegrityError), transaction.atomic():
        TerminalReceipt.objects.filter(pk=receipt.pk).update(terminal_status="working")
    receipt.refresh_from_db()
    assert receipt.terminal_status == "completed"


@pytest.mark.django_db(transaction=True)
def test_a_taken_receipt_slot_is_refused_inside_the_callers_transaction_without_a_savepoint() -> None:
    from django.test.utils import CaptureQueriesContext

    from ledger.services.acceptance import operation_accept_terminal_within

    op = _fetched_op()
    TerminalReceipt.objects.create(
        operation=op, call_node_id=op.call_node_id, execution_epoch=op.execution_epoch,
        terminal_status="completed", request_digest=op.request_digest, remote_id=op.remote_id,
        descriptor_version=op.descriptor_version, cancel_generation=op.cancel_generation,
        result_digest=op.result_digest)
    with CaptureQueriesContext(connection) as captured, transaction.atomic(durable=True):
        # What the caller wrote before acceptance stays, with the refusal, in one commit.
        Operation.objects.filter(id=op.id).update(server_status_message="written before")
        with pytest.raises(AcceptanceRefused) as refused:
            operation_accept_terminal_within(**_claim(op))
    assert refused.value.field == "receipt"
    assert [q["sql"] for q in captured.captured_queries if "SAVEPOINT" in q["sql"]] == []
    op.refresh_from_db()
    assert op.state == State.FETCHING_RESULT and op.server_status_message == "written before"
    assert OperationEvent.objects.filter(operation=op, kind="acceptance_refused").count() == 1
    assert TerminalReceipt.objects.filter(operation=op).count() == 1 and not OutboxEvent.objects.exists()


@pytest.mark.django_db
def test_the_receipt_and_its_outbox_row_are_one_statement_with_the_whole_payload() -> None:
    from django.test.utils import CaptureQueriesContext

    op = _fetched_op()
    with CaptureQueriesContext(connection) as captured:
        receipt = operation_accept_terminal(**_claim(op))
    inserts = [q["sql"] for q in captured.captured_queries
               if "INSERT" in q["sql"] and ("ledger_terminalreceipt" in q["sql"]
                                            or "ledger_outboxevent" in q["sql"])]
    assert len(inserts) == (1 if connection.vendor == "postgresql" else 2)
    outbox = OutboxEvent.objects.get(receipt=receipt)
    assert outbox.payload == {
        "receipt_id": receipt.pk, "operation_id": str(op.id), "call_node_id": op.call_node_id,
        "execution_epoch": op.execution_epoch, "terminal_status": "completed",
        "result_digest": op.result_digest, "payload": RESULT,
    }
    assert outbox.created_at is not None and outbox.published_at is None and outbox.attempts == 0
    assert TerminalReceipt.objects.get(pk=receipt.pk).operation_id == op.id


@pytest.mark.django_db
def test_a_project_listening_to_outbox_saves_gets_its_hook_and_the_same_rows() -> None:
    from django.db.models.signals import post_save

    saved: list[dict[str, Any]] = []

    def listener(sender: Any, instance: OutboxEvent, created: bool, **kwargs: Any) -> None:
        saved.append(dict(instance.payload))

    post_save.connect(listener, sender=OutboxEvent)
    try:
        op = _fetched_op()
        receipt = operation_accept_terminal(**_claim(op))
    finally:
        post_save.disconnect(listener, sender=OutboxEvent)
    assert saved == [OutboxEvent.objects.get(receipt=receipt).payload]
    assert saved[0]["receipt_id"] == receipt.pk and saved[0]["operation_id"] == str(op.id)


@pytest.mark.django_db
def test_a_task_row_skips_the_shadow_probe_and_a_sync_row_completes_its_waiting_comparison() -> None:
    from django.test.utils import CaptureQueriesContext

    from ledger.models import ShadowComparison

    task_row = _fetched_op()
    with CaptureQueriesContext(connection) as captured:
        operation_accept_terminal(**_claim(task_row))
    assert not [q for q in captured.captured_queries if "ledger_shadowcomparison" in q["sql"]]

    legacy = _fetched_op(execution_mode="sync", executor_path="legacy")
    shadow = OperationFactory(call_node_id=legacy.call_node_id, shadow=True, shadow_of=legacy,
                              state=State.ACCEPTED)
    ShadowComparison.objects.create(shadow_operation=shadow, legacy_operation=legacy,
                                    call_node_id=legacy.call_node_id, tool_name="t",
                                    shadow_terminal_status="completed",
                                    shadow_result_digest="sha256:other")
    operation_accept_terminal(**_claim(legacy))
    comparison = ShadowComparison.objects.get(shadow_operation=shadow)
    assert comparison.verdict == ShadowComparison.Verdict.DISAGREE
    assert comparison.legacy_terminal_status == "completed"


@pytest.mark.django_db
def test_events_left_for_acceptance_are_refused_unless_it_writes_the_final_event() -> None:
    from ledger.services.acceptance import operation_accept_terminal_within
    from ledger.services.events import EventSpec

    op = _fetched_op()
    with transaction.atomic(), pytest.raises(ValueError):
        operation_accept_terminal_within(**_claim(op), events_before=[EventSpec(kind="lost")])
    assert not TerminalReceipt.objects.filter(operation=op).exists()
    assert not OperationEvent.objects.filter(operation=op).exists()


# The acceptance point's modules: nothing else may create a receipt or an outbox row.
_ACCEPTANCE = {Path("ledger/services/acceptance.py"), Path("ledger/services/acceptance_one_statement.py")}
_WRITTEN_ONLY_THERE = frozenset({"TerminalReceipt", "OutboxEvent"})
_CREATES = frozenset({"create", "bulk_create", "get_or_create", "update_or_create"})


def _receipt_writes(source: str) -> list[int]:
    """Lines in `source` that build a receipt or outbox row (the model called), create one
    through its manager, or name its table (what a raw INSERT is spelled from)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in _WRITTEN_ONLY_THERE:
            lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr in {*_CREATES, "db_table"}:
            base = node.value  # Model.objects.create, Model._meta.db_table
            if isinstance(base, ast.Attribute) and base.attr in {"objects", "_meta"}:
                base = base.value
            if isinstance(base, ast.Name) and base.id in _WRITTEN_ONLY_THERE:
                lines.append(node.lineno)
    return lines


def test_no_module_but_the_acceptance_point_writes_a_receipt_or_an_outbox_row() -> None:
    repo = Path(__file__).resolve().parents[2]
    offenders = []
    for package in ("ledger", "toolops", "adapters", "config"):
        for path in sorted((repo / package).rglob("*.py")):
            rel = path.relative_to(repo)
            if "migrations" in rel.parts or rel in _ACCEPTANCE or rel.parts[:2] == ("ledger", "models"):
                continue
            offenders += [f"{rel}:{line}" for line in _receipt_writes(path.read_text())]
    assert not offenders, "receipts and outbox rows are written by the acceptance point only:\n" \
        + "\n".join(offenders)
    # The scan sees the writers it allows.
    assert all(_receipt_writes((repo / rel).read_text()) for rel in _ACCEPTANCE)


@pytest.mark.parametrize("snippet", [
    "TerminalReceipt.objects.create(operation=op)",
    "OutboxEvent(receipt=r, payload={})",
    "OutboxEvent.objects.bulk_create(rows)",
    'f"INSERT INTO {qn(TerminalReceipt._meta.db_table)} VALUES (%s)"',
])
def test_the_receipt_scan_flags_a_planted_writer(snippet: str) -> None:
    assert _receipt_writes(snippet), snippet


@pytest.mark.parametrize("snippet", [
    "TerminalReceipt.objects.filter(operation=op).first()",
    "OutboxEvent.objects.filter(id=1).update(published_at=now)",
    "receipt.payload",
    "[f.attname for f in TerminalReceipt._meta.concrete_fields]",
])
def test_the_receipt_scan_leaves_reads_and_the_relay_alone(snippet: str) -> None:
    assert not _receipt_writes(snippet), snippet
