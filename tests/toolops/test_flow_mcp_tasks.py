"""End to end over real HTTP: submit, poll, fetch, accept against the reference SDK server."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.models import Operation, OperationEvent, OutboxEvent, TerminalReceipt, ToolServer
from ledger.selectors import operation_snapshot
from ledger.states import State
from tests.ledger.factories import OperationFactory
from tests.peers.launch import peer_stats
from tests.toolops.helpers import submit_tool_call
from toolops.errors import SubmitRefused
from toolops.runner import run_embedded

pytestmark = pytest.mark.django_db


@pytest.fixture
def server_options() -> dict[str, Any]:
    return {"sync_bounds": {"quick_sync": 5.0}}


def _run_until_settled() -> None:
    run_embedded(until_idle=True, max_seconds=30)


def test_server_add_negotiates_tasks_and_persists_session(server: ToolServer) -> None:
    assert server.protocol_version == "2025-11-25"
    assert server.session_id
    assert "call" in server.capabilities["tasks"]["requests"]["tools"]
    assert server.tools["sleep_then_complete"]["task_support"] == "required"
    assert server.tools["quick_sync"]["task_support"] == "forbidden"
    assert server.tools["sleep_then_complete"]["descriptor_digest"].startswith("sha256:")


def test_completed_task_is_fetched_digested_and_accepted(server: ToolServer, mcp_url: str) -> None:
    op = submit_tool_call(server, "sleep_then_complete", "n-complete", seconds=0.3, value="teal")
    assert op.state == State.WORKING and op.remote_id
    assert peer_stats(mcp_url)["submission_keys"].get(op.submission_key) == 1
    _run_until_settled()
    snap = operation_snapshot(operation_id=op.id)
    assert snap["state"] == State.ACCEPTED
    assert snap["receipt"]["terminal_status"] == "completed"
    assert snap["receipt"]["payload"]["payload"]["content"][0]["text"] == "teal"
    assert snap["result_digest"] == snap["receipt"]["result_digest"] != ""
    assert len(snap["outbox"]) == 1
    kinds = [e["kind"] for e in snap["events"]]
    # fetched before accepted, and never accepted on the status alone
    assert kinds.index("result_fetched") < kinds.index("accepted")
    assert kinds[0] == "created" and kinds[-1] == "accepted"
    assert [e["seq"] for e in snap["events"]] == list(range(1, len(kinds) + 1))


def test_failed_task_is_accepted_as_failed(server: ToolServer) -> None:
    op = submit_tool_call(server, "sleep_then_fail", "n-fail", seconds=0.2, message="disk full")
    _run_until_settled()
    receipt = TerminalReceipt.objects.get(operation=op)
    assert receipt.terminal_status == "failed"
    op.refresh_from_db()
    assert op.state == State.ACCEPTED and op.server_state == "failed"
    assert "disk full" in op.server_status_message


def test_is_error_result_is_completed_with_the_error_flag(server: ToolServer) -> None:
    op = submit_tool_call(server, "sleep_then_is_error", "n-iserror", seconds=0.2, message="3 rows bad")
    _run_until_settled()
    receipt = TerminalReceipt.objects.get(operation=op)
    assert receipt.terminal_status == "completed"
    assert receipt.payload is not None and receipt.payload["is_error"] is True
    assert OutboxEvent.objects.filter(receipt=receipt).count() == 1


def test_unknown_task_id_goes_to_reconciliation_and_advances_nothing(server: ToolServer) -> None:
    op = OperationFactory(server=server, tool_name="sleep_then_complete",
                          remote_id="no-such-task", state=State.WORKING)
    _run_until_settled()
    op.refresh_from_db()
    assert op.state == State.RECONCILIATION_REQUIRED
    assert not TerminalReceipt.objects.filter(operation=op).exists()
    event = OperationEvent.objects.get(operation=op, kind="reconciliation_required")
    assert event.data["reason"] == "not_found_unknown"


def test_tool_without_task_support_runs_within_its_published_bound(server: ToolServer,
                                                                   mcp_url: str) -> None:
    before = peer_stats(mcp_url)["tasks_created"]
    op = submit_tool_call(server, "quick_sync", "n-sync", value="pong")
    assert op.state == State.ACCEPTED and op.execution_mode == "sync"
    receipt = TerminalReceipt.objects.get(operation=op)
    assert receipt.payload is not None
    assert receipt.payload["payload"]["content"][0]["text"] == "pong"
    assert peer_stats(mcp_url)["tasks_created"] == before


def test_tool_without_task_support_or_bound_is_refused_before_anything_is_written(
    server: ToolServer, mcp_url: str
) -> None:
    calls_before = peer_stats(mcp_url)["tool_calls"].get("slow_sync", 0)
    with pytest.raises(SubmitRefused, match="no published synchronous bound"):
        submit_tool_call(server, "slow_sync", "n-slow", seconds=1)
    with pytest.raises(SubmitRefused, match="not published"):
        submit_tool_call(server, "no_such_tool", "n-none")
    assert not Operation.objects.exists()
    assert peer_stats(mcp_url)["tool_calls"].get("slow_sync", 0) == calls_before


def test_every_submission_creates_exactly_one_task_on_the_server(server: ToolServer,
                                                                  mcp_url: str) -> None:
    ops = [submit_tool_call(server, "sleep_then_complete", f"n-many-{i}", seconds=0.1, value=str(i))
           for i in range(5)]
    _run_until_settled()
    keys = peer_stats(mcp_url)["submission_keys"]
    assert all(keys.get(op.submission_key) == 1 for op in ops)
    assert TerminalReceipt.objects.filter(operation__in=ops).count() == 5
    assert OutboxEvent.objects.filter(receipt__operation__in=ops).count() == 5


def test_a_completed_status_without_its_fetched_result_is_never_stored() -> None:
    from toolops.services.settle_cycle import ResultRejected, result_stored

    with pytest.raises(ResultRejected, match="no result was fetched"):
        result_stored(status="completed", fetched=None, status_message="")
    with pytest.raises(ResultRejected, match="no result was fetched"):
        result_stored(status="failed", fetched=None, status_message="boom")
    assert result_stored(status="cancelled", fetched=None, status_message="")["kind"] == "none"
