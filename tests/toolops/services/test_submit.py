"""Submit when the ledger is away before the send: one typed line, nothing sent, nothing written."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import OperationalError

from ledger.models import Operation, ToolServer
from tests.peers.launch import peer_stats
from tests.toolops.api_fixtures import principal
from toolops.errors import LedgerUnavailable
from toolops.services import submit as submit_service
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db(transaction=True)


def _ledger_away(**_kwargs: Any) -> Operation:
    # What psycopg raises when the server closed the connection under the insert.
    raise OperationalError("server closed the connection unexpectedly")


def test_a_lost_ledger_before_the_send_is_a_typed_refusal_and_nothing_is_sent(
        server: ToolServer, mcp_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls_before = sum(peer_stats(mcp_url)["tool_calls"].values())
    monkeypatch.setattr(submit_service, "_create_row", _ledger_away)
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
    monkeypatch.setattr(submit_service, "_create_row", _ledger_away)
    response = client.post("/api/operations/", {"server": server.name, "tool": "sleep_then_complete",
                                                "call_node_id": "away-rest",
                                                "arguments": {"seconds": 0.2, "value": "x"}}, format="json")
    assert response.status_code == 503, response.content
    assert response.json()["error"] == "LedgerUnavailable"
