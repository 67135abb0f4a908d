"""Submit when the ledger is away before the send: one typed line, nothing sent, nothing written."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import OperationalError

from ledger.models import Operation, ToolServer
from tests.peers.launch import peer_stats
from tests.toolops.api_fixtures import principal
from toolops.errors import LedgerUnavailable, SubmitRefused
from toolops.services import submit as submit_service
from toolops.services import submit_row as submit_row_service
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db(transaction=True)


def _ledger_away(**_kwargs: Any) -> Operation:
    # What psycopg raises when the server closed the connection under the insert.
    raise OperationalError("server closed the connection unexpectedly")


def test_a_lost_ledger_before_the_send_is_a_typed_refusal_and_nothing_is_sent(
        server: ToolServer, mcp_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls_before = sum(peer_stats(mcp_url)["tool_calls"].values())
    monkeypatch.setattr(submit_row_service, "submit_row_create", _ledger_away)
    with pytest.raises(LedgerUnavailable) as refused:
        operation_submit(server_name=server.name, tool_name="sleep_then_complete",
                         call_node_id=f"away-{uuid.uuid4().hex[:6]}",
                         arguments={"seconds": 0.2, "value": "x"})
    message = str(refused.value)
    assert "\n" not in message and "nothing was sent" in message, message
    assert "closed the connection" not in message  # the driver's text stays out of the answer
    assert not Operation.objects.exists()
    assert sum(peer_stats(mcp_url)["tool_calls"].values()) == calls_before


def test_the_rest_submit_answers_503_with_the_reason(
        server: ToolServer, monkeypatch: pytest.MonkeyPatch) -> None:
    client = principal(username="away", org="acme")
    monkeypatch.setattr(submit_row_service, "submit_row_create", _ledger_away)
    response = client.post("/api/operations/", {"server": server.name, "tool": "sleep_then_complete",
                                                "call_node_id": "away-rest",
                                                "arguments": {"seconds": 0.2, "value": "x"}}, format="json")
    assert response.status_code == 503, response.content
    assert response.json()["error"] == "LedgerUnavailable"


def test_a_replay_is_answered_from_its_key_even_where_a_new_submit_is_refused(
        server: ToolServer, mcp_url: str) -> None:
    from toolops import api
    from toolops.errors import SubmitRefused
    from toolops.services.adapters_admin import adapter_set_status

    call = {"server": server.name, "tool": "sleep_then_complete", "call_node_id": "replay-1",
            "arguments": {"seconds": 0.2, "value": "x"}, "idempotency_key": "replay-1/try-1"}
    first = api.submit_call(**call)
    adapter_set_status(version=server.adapter_version, status="draining", reason="test")
    try:
        # The key decides: the replay gets what its first submit recorded, nothing is sent.
        assert api.submit_call(**call).id == first.id
        with pytest.raises(SubmitRefused):
            api.submit_call(**{**call, "call_node_id": "replay-2", "idempotency_key": "replay-2/try-1"})
    finally:
        adapter_set_status(version=server.adapter_version, status="enabled")
    assert Operation.objects.count() == 1
    assert peer_stats(mcp_url)["submission_keys"][Operation.objects.get().submission_key] == 1


def test_a_second_live_attempt_of_a_call_node_is_refused_at_the_insert(server: ToolServer) -> None:
    from toolops.errors import SubmitRefused

    operation_submit(server_name=server.name, tool_name="sleep_then_complete",
                     call_node_id="node-1", arguments={"seconds": 0.2, "value": "x"})
    with pytest.raises(SubmitRefused, match="already has an attempt"):
        operation_submit(server_name=server.name, tool_name="sleep_then_complete",
                         call_node_id="node-1", arguments={"seconds": 0.2, "value": "x"},
                         submission_key="another-key")
    assert Operation.objects.count() == 1


def test_only_a_synchronous_call_can_have_a_shadow(server: ToolServer, mcp_url: str) -> None:
    # Acceptance looks for a waiting shadow comparison only on synchronous rows: a shadow of a
    # task-mode row would never be compared, so none is ever created.
    task_call = operation_submit(server_name=server.name, tool_name="sleep_then_complete",
                                 call_node_id=f"noshadow-{uuid.uuid4().hex[:6]}",
                                 arguments={"seconds": 0.2, "value": "x"})
    assert task_call.execution_mode == "task"
    created_before = peer_stats(mcp_url)["tasks_created"]
    with pytest.raises(SubmitRefused, match="synchronous"):
        submit_service.shadow_submit(legacy=task_call, server=server,
                                     tool=server.tools["sleep_then_complete"], ttl_ms=None)
    assert not Operation.objects.filter(shadow_of=task_call).exists()
    assert peer_stats(mcp_url)["tasks_created"] == created_before
