"""Input rounds through the gate, against the reference SDK server over real HTTP."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from adapters.base import ServerRequest
from ledger.models import InputRequest, Operation, OperationEvent, TerminalReceipt, ToolServer
from ledger.states import State
from toolops.runner import run_embedded
from toolops.services.connections import adapter_for_server
from toolops.services.dispatch import operations_claim_due
from toolops.services.executors import operation_refuse_stale
from toolops.services.inputs import (
    InputAnswerRefused,
    input_rounds_expire_due,
    input_schema_digest,
    operation_answer_input,
    operation_open_input_round,
)
from toolops.services.rollout import operation_hand_over_locked
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db


def _ask(server: ToolServer, node: str, *, rounds: int = 1, **options: bool) -> Operation:
    op = operation_submit(server_name=server.name, tool_name="ask_input", call_node_id=node,
                          arguments={"question": "colour?", "rounds": rounds, **options},
                          ttl_ms=60_000)
    run_embedded(until_idle=True, max_seconds=15)
    op.refresh_from_db()
    return op


def _round(op: Operation, n: int) -> InputRequest:
    return InputRequest.objects.get(operation=op, round=n)


def _answer(op: Operation, n: int, value: str) -> str:
    return operation_answer_input(operation_id=op.id, input_round=n,
                                  schema_digest=_round(op, n).schema_digest,
                                  response={"value": value})


def _events(op: Operation) -> list[tuple[str, object]]:
    """Kinds with their data, for a failure message that says what each poll saw."""
    return list(OperationEvent.objects.filter(operation=op).order_by("seq")
                .values_list("kind", "data"))


def _kinds(op: Operation) -> list[str]:
    return list(OperationEvent.objects.filter(operation=op).order_by("seq")
                .values_list("kind", flat=True))


def test_input_round_is_opened_then_answered_and_the_task_completes(server: ToolServer) -> None:
    op = _ask(server, "i-answer")
    assert op.state == State.INPUT_REQUIRED and op.input_round == 1
    assert op.next_poll_at is None  # auto-polling paused
    ir = _round(op, 1)
    assert ir.status == InputRequest.Status.OPEN and ir.method == "elicitation/create"
    assert ir.params["message"] == "colour?"
    assert json.loads(ir.server_request_id).startswith(f"task-{op.remote_id}-")
    assert ir.schema_digest == input_schema_digest(method=ir.method, params=ir.params)
    assert ir.deadline > timezone.now()

    assert _answer(op, 1, "teal") == "delivered"
    op.refresh_from_db()
    assert op.state == State.WORKING
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.ANSWERED and ir.delivered_at is not None
    run_embedded(until_idle=True, max_seconds=15)
    receipt = TerminalReceipt.objects.get(operation=op)
    assert receipt.terminal_status == "completed"
    assert receipt.payload is not None
    assert receipt.payload["payload"]["structuredContent"] == {"answers": ["teal"]}


def test_wrong_round_stale_digest_bad_shape_and_second_answer_are_refused(
    server: ToolServer,
) -> None:
    op = _ask(server, "i-refused")
    digest = _round(op, 1).schema_digest
    with pytest.raises(InputAnswerRefused, match="no input round 2"):
        operation_answer_input(operation_id=op.id, input_round=2, schema_digest=digest,
                               response={"value": "x"})
    with pytest.raises(InputAnswerRefused, match="stale schema digest"):
        operation_answer_input(operation_id=op.id, input_round=1, schema_digest="sha256:old",
                               response={"value": "x"})
    with pytest.raises(InputAnswerRefused, match="does not match the requested schema"):
        operation_answer_input(operation_id=op.id, input_round=1, schema_digest=digest,
                               response={"colour": "x"})
    op.refresh_from_db()
    assert op.state == State.INPUT_REQUIRED and _round(op, 1).status == InputRequest.Status.OPEN
    assert _kinds(op).count("input_answer_refused") == 3

    assert _answer(op, 1, "red") == "delivered"
    with pytest.raises(InputAnswerRefused, match="already answered"):
        _answer(op, 1, "blue")
    run_embedded(until_idle=True, max_seconds=15)
    receipt = TerminalReceipt.objects.get(operation=op)
    assert receipt.payload is not None
    assert receipt.payload["payload"]["structuredContent"] == {"answers": ["red"]}


def test_late_answer_is_refused_and_nothing_is_sent(server: ToolServer) -> None:
    op = _ask(server, "i-late")
    InputRequest.objects.filter(operation=op).update(deadline=timezone.now() - timedelta(seconds=1))
    with pytest.raises(InputAnswerRefused, match="deadline of input round 1 passed"):
        _answer(op, 1, "teal")
    op.refresh_from_db()
    assert op.state == State.INPUT_REQUIRED
    assert _round(op, 1).answer is None
    assert adapter_for_server(server=server).get(remote_id=op.remote_id).status == "input_required"


def test_input_required_replayed_twice_opens_one_round(server: ToolServer) -> None:
    op = _ask(server, "i-replay")
    first = _round(op, 1)
    seen_input_required = adapter_for_server(server=server).get(remote_id=op.remote_id)
    assert seen_input_required.status == "input_required"
    assert _answer(op, 1, "teal") == "delivered"
    replayed = ServerRequest(request_id=json.loads(first.server_request_id), method=first.method,
                             params=first.params, related_task_id=op.remote_id)
    for _ in range(2):
        # The same observation and the same server request reach a worker again.
        adapter_for_server(server=server).pending_server_requests.append(replayed)
        Operation.objects.filter(id=op.id).update(next_poll_at=timezone.now())
        assert operations_claim_due(owner="replay") == [op.id]
        op.refresh_from_db()
        outcome = operation_open_input_round(op=op, lease_owner="replay", task=seen_input_required,
                                             fields={}, data={"status": "input_required"})
        assert outcome == "input_required_replayed"
    assert InputRequest.objects.filter(operation=op).count() == 1
    op.refresh_from_db()
    assert op.input_round == 1 and op.state == State.WORKING
    run_embedded(until_idle=True, max_seconds=15)
    op.refresh_from_db()
    assert op.state == State.ACCEPTED
    assert _kinds(op).count("input_required_no_new_round") == 2


def test_a_replayed_input_required_read_by_a_worker_of_an_old_epoch_writes_nothing(
        server: ToolServer) -> None:
    """The row is handed to the other executor while a worker reads a replayed input request:
    that worker must not note anything (found by the 10,000-series simulation)."""
    op = _ask(server, "i-stale-epoch")
    first = _round(op, 1)
    seen_input_required = adapter_for_server(server=server).get(remote_id=op.remote_id)
    assert _answer(op, 1, "teal") == "delivered"
    adapter_for_server(server=server).pending_server_requests.append(ServerRequest(
        request_id=json.loads(first.server_request_id), method=first.method, params=first.params,
        related_task_id=op.remote_id))
    Operation.objects.filter(id=op.id).update(next_poll_at=timezone.now())
    assert operations_claim_due(owner="old-epoch") == [op.id]
    op.refresh_from_db()
    with transaction.atomic():
        operation_hand_over_locked(op=Operation.objects.select_for_update().get(id=op.id),
                                   to_path="legacy", reason="rollback mid-read", actor="t",
                                   now=timezone.now())
    kinds_before = _kinds(op)
    outcome = operation_open_input_round(op=op, lease_owner="old-epoch", task=seen_input_required,
                                         fields={}, data={"status": "input_required"})
    assert outcome == "stale"
    assert _kinds(op) == kinds_before  # no note, no round, no state
    assert InputRequest.objects.filter(operation=op).count() == 1
    # Through operation_poll the same outcome is recorded as the epoch refusal it is.
    assert operation_refuse_stale(operation_id=op.id, claimed_epoch=op.execution_epoch,
                                  lease_owner="old-epoch", source="poll")
    assert _kinds(op)[-1] == "stale_epoch_refused"


def test_two_rounds_in_one_task(server: ToolServer) -> None:
    op = _ask(server, "i-two", rounds=2)
    assert op.input_round == 1
    assert _answer(op, 1, "a") == "delivered"
    run_embedded(until_idle=True, max_seconds=15)
    op.refresh_from_db()
    # The events say which way a miss went (a round-2 request never read, or read and refused).
    assert op.state == State.INPUT_REQUIRED and op.input_round == 2, _events(op)
    assert _round(op, 2).params["message"] == "colour? (2/2)"
    with pytest.raises(InputAnswerRefused, match="already answered"):
        _answer(op, 1, "again")
    assert _answer(op, 2, "b") == "delivered"
    run_embedded(until_idle=True, max_seconds=15)
    op.refresh_from_db()
    assert op.state == State.ACCEPTED
    receipt = TerminalReceipt.objects.get(operation=op)
    assert receipt.payload is not None
    assert receipt.payload["payload"]["structuredContent"] == {"answers": ["a", "b"]}
    assert [r.status for r in InputRequest.objects.filter(operation=op).order_by("round")] == [
        "answered", "answered"]


def test_a_request_id_the_sdk_reuses_for_the_same_question_opens_the_next_round(
        server: ToolServer) -> None:
    """mcp 1.30 ends a task's request id in `id(params)`, which CPython recycles: round 2 often
    carries round 1's id. `same_request_id` makes that certain; the question is asked twice in
    the same words, so only when the stream was opened tells the new request from a replay."""
    op = _ask(server, "i-reused-id", rounds=2, numbered=False, same_request_id=True)
    first = _round(op, 1)
    assert _answer(op, 1, "a") == "delivered"
    run_embedded(until_idle=True, max_seconds=15)
    op.refresh_from_db()
    assert op.state == State.INPUT_REQUIRED and op.input_round == 2, _events(op)
    second = _round(op, 2)
    assert second.server_request_id == first.server_request_id
    assert second.params == first.params
    opened = OperationEvent.objects.filter(operation=op, kind="input_round_opened").last()
    assert opened is not None and opened.data["reused_request_ids"] == [first.server_request_id]
    assert _answer(op, 2, "b") == "delivered"
    run_embedded(until_idle=True, max_seconds=15)
    op.refresh_from_db()
    assert op.state == State.ACCEPTED, _events(op)
    receipt = TerminalReceipt.objects.get(operation=op)
    assert receipt.payload is not None
    assert receipt.payload["payload"]["structuredContent"] == {"answers": ["a", "b"]}


@override_settings(TOOLOPS_INPUT_EXPIRY_POLICY="reconcile")
def test_deadline_passed_goes_to_reconciliation(server: ToolServer) -> None:
    op = _ask(server, "i-expire-recon")
    InputRequest.objects.filter(operation=op).update(deadline=timezone.now() - timedelta(seconds=1))
    assert input_rounds_expire_due() == 1
    op.refresh_from_db()
    assert op.state == State.RECONCILIATION_REQUIRED
    assert _round(op, 1).status == InputRequest.Status.EXPIRED
    event = OperationEvent.objects.get(operation=op, kind="reconciliation_required")
    assert event.data["reason"] == "input_deadline_passed"
    assert input_rounds_expire_due() == 0  # recorded once


@override_settings(TOOLOPS_INPUT_EXPIRY_POLICY="cancel")
def test_deadline_passed_cancels_when_the_policy_says_so(server: ToolServer) -> None:
    op = _ask(server, "i-expire-cancel")
    InputRequest.objects.filter(operation=op).update(deadline=timezone.now() - timedelta(seconds=1))
    run_embedded(until_idle=True, max_seconds=10)  # the dispatcher tick runs the sweep
    op.refresh_from_db()
    assert op.state == State.CANCELLED_ACCEPTED
    assert TerminalReceipt.objects.get(operation=op).terminal_status == "cancelled"
    assert "input_deadline_passed" in _kinds(op)
    assert adapter_for_server(server=server).get(remote_id=op.remote_id).status == "cancelled"


def test_answer_command(server: ToolServer) -> None:
    op = _ask(server, "i-cli")
    with pytest.raises(CommandError, match="stale schema digest"):
        call_command("toolops", "answer", str(op.id), "--round", "1", "--json", '{"value": "x"}',
                     "--schema-digest", "sha256:nope", stdout=io.StringIO())
    out = io.StringIO()
    call_command("toolops", "answer", str(op.id), "--round", "1", "--json",
                 '{"action": "accept", "content": {"value": "cli"}}', stdout=out)
    shown = json.loads(out.getvalue())
    assert shown["state"] == State.WORKING
    assert shown["input_requests"][0]["status"] == "answered"
    run_embedded(until_idle=True, max_seconds=15)
    receipt = TerminalReceipt.objects.get(operation=op)
    assert receipt.payload is not None
    assert receipt.payload["payload"]["structuredContent"] == {"answers": ["cli"]}
