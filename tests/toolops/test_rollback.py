"""Rollback with rows in flight: stale workers refused, one receipt per row, and zero
second remote operations, counted on the reference SDK server itself."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from ledger.models import (
    Operation,
    OperationEvent,
    OutboxEvent,
    RolloutChange,
    TerminalReceipt,
    ToolServer,
)
from ledger.states import State
from tests.peers.launch import peer_stats
from toolops.errors import SubmitRefused
from toolops.services.cancel import operation_cancel
from toolops.services.executors import executor_claim_due, executor_lease_owner, executor_run
from toolops.services.observe import operation_poll
from toolops.services.rollout import rollout_move
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db(transaction=True)

IN_FLIGHT = 8


@pytest.fixture
def server_options() -> dict[str, Any]:
    # A high QPS cap: the test is about epochs, and cap pacing of the 8 submits must not let the
    # first task finish before its cancel is sent.
    return {"sync_bounds": {"read_value": 10.0}, "max_qps": 200}


def _submit_in_flight(n: int) -> list[Operation]:
    return [
        operation_submit(server_name="ref", tool_name="sleep_then_complete",
                         call_node_id=f"rb-{i}", arguments={"seconds": 3, "value": f"v{i}"},
                         ttl_ms=60_000)
        for i in range(n)
    ]


def test_rollback_with_rows_in_flight(server: ToolServer, mcp_url: str) -> None:
    before = peer_stats(mcp_url)
    ops = _submit_in_flight(IN_FLIGHT)
    assert {o.executor_path for o in ops} == {"tasks"} and {o.state for o in ops} == {State.WORKING}
    # A tasks-path worker holds leases on the due rows when the rollback lands.
    Operation.objects.update(next_poll_at="2999-01-01T00:00Z")  # never None: op_open_row_scheduled
    Operation.objects.filter(id__in=[o.id for o in ops]).update(next_poll_at="2000-01-01T00:00Z")
    stale_owner = executor_lease_owner(path="tasks")
    claimed = executor_claim_due(path="tasks", owner=stale_owner)
    assert len(claimed) == IN_FLIGHT

    change = rollout_move(to_path="legacy", reason="canary error rate", actor="oncall:ana")
    assert change.rows_moved == IN_FLIGHT and change.actor == "oncall:ana"
    rows = Operation.objects.filter(id__in=[o.id for o in ops])
    assert {(r.executor_path, r.execution_epoch, r.lease_owner) for r in rows} == {("legacy", 2, "")}

    # The stale worker comes back: refused, recorded, nothing written for it.
    outcomes = [operation_poll(operation_id=i, lease_owner=stale_owner) for i in claimed]
    assert outcomes == ["stale_epoch"] * IN_FLIGHT
    refusals = OperationEvent.objects.filter(kind="stale_epoch_refused")
    assert refusals.count() == IN_FLIGHT
    assert {(e.data["claimed_epoch"], e.data["row_epoch"]) for e in refusals} == {(1, 2)}

    # The legacy executor's cancel works on the existing remote task, under the new epoch.
    assert operation_cancel(operation_id=ops[0].id).startswith("accepted")

    # No new operation on the tasks path: a task-only tool is refused, a dual tool goes legacy.
    with pytest.raises(SubmitRefused):
        operation_submit(server_name="ref", tool_name="sleep_then_complete", call_node_id="rb-new",
                         arguments={"seconds": 0, "value": "x"})
    late = operation_submit(server_name="ref", tool_name="read_value", call_node_id="rb-read",
                            arguments={"seconds": 0, "value": "r"})
    assert late.executor_path == "legacy" and late.execution_mode == "sync"

    # The tasks executor has nothing left; the legacy executor continues every moved row.
    assert executor_run(path="tasks", until_idle=True, max_seconds=5).polls == 0
    executor_run(path="legacy", until_idle=True, max_seconds=60)
    states = sorted(Operation.objects.filter(id__in=[o.id for o in ops])
                    .values_list("state", flat=True))
    assert states == sorted([State.CANCELLED_ACCEPTED] + [State.ACCEPTED] * (IN_FLIGHT - 1))
    for op in ops:
        receipts = TerminalReceipt.objects.filter(call_node_id=op.call_node_id)
        assert receipts.count() == 1 and receipts.get().execution_epoch == 2
    assert OutboxEvent.objects.count() == IN_FLIGHT + 1  # + the synchronous read_value

    after = peer_stats(mcp_url)
    assert after["tasks_created"] - before["tasks_created"] == IN_FLIGHT  # zero second operations
    for op in ops:
        assert after["submission_keys"][op.submission_key] == 1
    assert after["tool_calls"]["sleep_then_complete"] - before["tool_calls"].get(
        "sleep_then_complete", 0) == IN_FLIGHT


def test_roll_forward_is_the_same_in_reverse_and_both_are_recorded(server: ToolServer) -> None:
    ops = _submit_in_flight(3)
    rollout_move(to_path="legacy", reason="incident 12", actor="oncall:ana")
    # The bumped rows keep their call nodes: no second attempt at the old (or any) epoch.
    with pytest.raises(SubmitRefused):
        operation_submit(server_name="ref", tool_name="read_value", call_node_id=ops[0].call_node_id,
                         arguments={"seconds": 0, "value": "again"})
    back = rollout_move(to_path="tasks", reason="fixed in 1.4.2", actor="oncall:bo")
    assert back.action == "roll_forward" and back.rows_moved == 3
    rows = Operation.objects.filter(id__in=[o.id for o in ops])
    assert {(r.executor_path, r.execution_epoch) for r in rows} == {("tasks", 3)}
    executor_run(path="tasks", until_idle=True, max_seconds=60)
    assert set(TerminalReceipt.objects.values_list("execution_epoch", flat=True)) == {3}
    assert list(RolloutChange.objects.order_by("pk").values_list("action", "actor", "reason")) == [
        ("rollback", "oncall:ana", "incident 12"), ("roll_forward", "oncall:bo", "fixed in 1.4.2")]


def test_rollback_leaves_accepted_rows_alone(server: ToolServer) -> None:
    op = operation_submit(server_name="ref", tool_name="sleep_then_complete", call_node_id="done",
                          arguments={"seconds": 0, "value": "x"}, ttl_ms=60_000)
    executor_run(path="tasks", until_idle=True, max_seconds=30)
    assert Operation.objects.get(id=op.id).state == State.ACCEPTED
    assert rollout_move(to_path="legacy", reason="r", actor="a").rows_moved == 0
    assert Operation.objects.get(id=op.id).execution_epoch == 1
    # The call node keeps its one attempt: no second attempt at any epoch.
    with pytest.raises(SubmitRefused):
        operation_submit(server_name="ref", tool_name="read_value", call_node_id="done",
                         arguments={"seconds": 0, "value": "x"})


def test_cli_rollback_and_rollout_report(server: ToolServer) -> None:
    _submit_in_flight(2)
    out = StringIO()
    call_command("toolops", "rollback", "--to", "legacy", "--reason", "drill", "--server", "ref",
                 "--actor", "cli:test", stdout=out)
    printed = json.loads(out.getvalue())
    assert printed["rows_moved"] == 2 and printed["to"] == "legacy" and printed["actor"] == "cli:test"
    out = StringIO()
    call_command("toolops", "rollout", "--server", "ref", "--tool", "read_value",
                 "--canary-percent", "5", "--shadow", "on", "--reason", "try", "--report",
                 stdout=out)
    printed = json.loads(out.getvalue())
    assert printed["change"]["after"]["canary_bp"] == 500
    assert printed["change"]["after"]["shadow_enabled"] is True
    assert printed["shadow_report"]["counts"] == {"agree": 0, "disagree": 0, "pending": 0}
