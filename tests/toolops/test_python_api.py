"""The public Python API (toolops.api), used as an embedding application would, against the real peer."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from ledger.models import InputRequest, Operation
from ledger.states import State
from tests.peers.launch import peer_stats
from toolops import api
from toolops.runner import run_embedded
from toolops.services.servers import server_add

pytestmark = pytest.mark.django_db


@pytest.fixture
def ref(mcp_url: str) -> str:
    return server_add(name="ref", url=mcp_url).name


def test_embedding_flow_submit_get_consume(ref: str, mcp_url: str) -> None:
    op = api.submit_call(server=ref, tool="sleep_then_complete", call_node_id="plan-7/step-3",
                         arguments={"seconds": 0.2, "value": "teal"}, idempotency_key="plan-7/step-3/try-1")
    assert isinstance(op, api.OperationView) and op.state == State.WORKING and op.receipt is None
    again = api.submit_call(server=ref, tool="sleep_then_complete", call_node_id="plan-7/step-3",
                            arguments={"seconds": 0.2, "value": "teal"},
                            idempotency_key="plan-7/step-3/try-1")
    assert again.id == op.id
    with pytest.raises(api.IdempotencyMismatch):
        api.submit_call(server=ref, tool="sleep_then_complete", call_node_id="plan-7/step-3",
                        arguments={"seconds": 0.2, "value": "red"}, idempotency_key="plan-7/step-3/try-1")
    row = Operation.objects.get(id=op.id)
    assert peer_stats(mcp_url)["submission_keys"][row.submission_key] == 1

    run_embedded(until_idle=True, max_seconds=30)
    done = api.get_operation(operation_id=op.id)
    assert done.state == State.ACCEPTED and done.receipt is not None
    assert done.receipt.terminal_status == "completed" and done.receipt.result_digest

    advanced: dict[str, dict[str, Any]] = {}

    def advance(*, event: dict[str, Any], idempotency_key: str) -> None:
        advanced.setdefault(idempotency_key, event)

    stats = api.consume_outbox(handler=advance)
    assert stats.published == 1
    assert advanced == {str(done.receipt.id): advanced[str(done.receipt.id)]}
    assert advanced[str(done.receipt.id)]["operation_id"] == str(op.id)
    assert api.consume_outbox(handler=advance).claimed == 0


def test_tenant_scoping_in_the_python_api(ref: str) -> None:
    op = api.submit_call(server=ref, tool="sleep_then_complete", call_node_id="n-t",
                         arguments={"seconds": 0.1, "value": "teal"}, tenant="acme")
    assert api.get_operation(operation_id=op.id, tenant="acme").id == op.id
    with pytest.raises(api.OperationNotVisible):
        api.get_operation(operation_id=op.id, tenant="globex")
    with pytest.raises(api.OperationNotVisible):
        api.get_operation(operation_id=uuid.uuid4())
    with pytest.raises(api.OperationNotVisible):
        api.cancel_operation(operation_id=op.id, tenant="globex")
    row = Operation.objects.get(id=op.id)
    InputRequest.objects.create(operation=row, round=1, server_request_id="r1", method="elicitation/create",
                                params={"message": "?"}, schema_digest="sha256:s",
                                deadline=timezone.now() + timedelta(hours=1))
    (open_round,) = api.list_open_input_requests(tenant="acme")
    assert (open_round.operation_id, open_round.round, open_round.schema_digest) == (op.id, 1, "sha256:s")
    assert api.list_open_input_requests(tenant="globex") == []


def test_cancel_through_the_python_api_is_final_once_accepted(ref: str) -> None:
    op = api.submit_call(server=ref, tool="sleep_then_complete", call_node_id="n-c",
                         arguments={"seconds": 30, "value": "teal"})
    view = api.cancel_operation(operation_id=op.id)
    assert view.state == "CANCELLED_ACCEPTED"
    assert view.receipt is not None and view.receipt.terminal_status == "cancelled"
    with pytest.raises(api.CancelRefused):
        api.cancel_operation(operation_id=op.id)
    with pytest.raises(api.InputAnswerRefused):
        api.answer_input(operation_id=op.id, input_round=1, schema_digest="sha256:s", response={})


def test_arguments_the_ledger_cannot_digest_are_refused_before_any_write(ref: str) -> None:
    with pytest.raises(api.ToolopsError, match="RFC 8785"):
        api.submit_call(server=ref, tool="sleep_then_complete", call_node_id="n-big",
                        arguments={"seconds": 0.1, "value": "v", "n": 2**60})
    assert Operation.objects.count() == 0
