"""Canary share and shadow operations against the reference SDK server."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.models import Operation, OutboxEvent, ShadowComparison, TerminalReceipt, ToolServer
from ledger.selectors.rollout import shadow_report
from ledger.states import State
from tests.peers.launch import peer_stats
from tests.toolops.helpers import submit_sleep, submit_tool_call
from toolops.runner import run_embedded
from toolops.services.rollout import canary_bucket, rollout_configure

BOUNDS = {"read_value": 10.0, "write_value": 10.0, "quick_sync": 5.0}


@pytest.fixture
def server_options() -> dict[str, Any]:
    return {"sync_bounds": BOUNDS}


def _share(nodes: list[str], bp: int) -> float:
    return 100.0 * sum(canary_bucket(call_node_id=n) < bp for n in nodes) / len(nodes)


@pytest.mark.parametrize("percent", [1.0, 5.0, 25.0, 50.0])
def test_canary_share_over_10000_nodes_within_one_point_and_stable(percent: float) -> None:
    nodes = [f"run-7/step-{i}/call-0" for i in range(10_000)]
    share = _share(nodes, round(percent * 100))
    assert abs(share - percent) <= 1.0, share
    # Stable: the same nodes land in the same buckets every time (no per-process salt).
    assert [canary_bucket(call_node_id=n) for n in nodes[:500]] == [
        canary_bucket(call_node_id=n) for n in nodes[:500]]


def test_canary_bucket_is_a_fixed_function_of_the_node() -> None:
    # sha256("a")[:8] big-endian mod 10000, computed independently of the implementation.
    import hashlib
    expected = int(hashlib.sha256(b"a").hexdigest()[:16], 16) % 10_000
    assert canary_bucket(call_node_id="a") == expected


@pytest.mark.django_db
def test_canary_routes_by_bucket_and_a_change_affects_new_calls_only(server: ToolServer) -> None:
    rollout_configure(server_name="ref", tool_name="read_value", canary_percent=50.0,
                      actor="test", reason="half")
    nodes = [f"canary-{i}" for i in range(12)]
    ops = [submit_tool_call("ref", "read_value", n, seconds=0, value="v") for n in nodes]
    for n, op in zip(nodes, ops, strict=True):
        expected = "tasks" if canary_bucket(call_node_id=n) < 5000 else "legacy"
        assert op.executor_path == expected
        assert op.execution_mode == ("task" if expected == "tasks" else "sync")
    assert {o.executor_path for o in ops} == {"tasks", "legacy"}
    rollout_configure(server_name="ref", tool_name="read_value", canary_percent=0.0,
                      actor="test", reason="stop")
    # Rows already created keep their path; a new call now takes the legacy path.
    assert [Operation.objects.get(id=o.id).executor_path for o in ops] == [
        o.executor_path for o in ops]
    assert submit_tool_call("ref", "read_value", "canary-new", seconds=0, value="v").executor_path == "legacy"
    run_embedded(until_idle=True, max_seconds=30)
    assert Operation.objects.filter(state=State.ACCEPTED).count() == 13


@pytest.mark.django_db(transaction=True)
def test_shadow_on_read_only_tool_records_comparison_and_no_outbox(
    server: ToolServer, mcp_url: str
) -> None:
    rollout_configure(server_name="ref", tool_name="read_value", canary_percent=0.0, shadow=True,
                      actor="test", reason="shadow the read")
    before = peer_stats(mcp_url)["tasks_created"]
    legacy = submit_tool_call("ref", "read_value", "shadow-1", seconds=0.2, value="same")
    assert legacy.executor_path == "legacy" and legacy.state == State.ACCEPTED
    shadow = Operation.objects.get(shadow_of=legacy)
    assert shadow.shadow and shadow.executor_path == "tasks" and shadow.remote_id
    assert shadow.call_node_id == legacy.call_node_id
    assert peer_stats(mcp_url)["tasks_created"] == before + 1  # the shadow's own task
    run_embedded(until_idle=True, max_seconds=30)
    shadow.refresh_from_db()
    assert shadow.state == State.ACCEPTED
    comparison = ShadowComparison.objects.get(shadow_operation=shadow)
    assert comparison.verdict == "agree", comparison.detail
    # One receipt and one outbox row in total: the legacy call's. The shadow has neither.
    assert TerminalReceipt.objects.filter(call_node_id="shadow-1").count() == 1
    assert not TerminalReceipt.objects.filter(operation=shadow).exists()
    assert OutboxEvent.objects.count() == 1
    assert OutboxEvent.objects.get().receipt.operation_id == legacy.id
    assert shadow_report(server_name="ref")["counts"] == {"agree": 1, "disagree": 0, "pending": 0}


@pytest.mark.django_db(transaction=True)
def test_shadow_disagreement_is_reported(server: ToolServer) -> None:
    rollout_configure(server_name="ref", tool_name="read_value", shadow=True,
                      actor="test", reason="shadow")
    legacy = submit_tool_call("ref", "read_value", "shadow-2", seconds=0.2, value="x")
    shadow = Operation.objects.get(shadow_of=legacy)
    # The shadow's arguments are the legacy call's; make the legacy outcome differ after the
    # fact by changing what it stored (as a path bug would) before the shadow finishes.
    Operation.objects.filter(id=legacy.id).update(result={"kind": "result", "payload": "other",
                                                          "is_error": False})
    run_embedded(until_idle=True, max_seconds=30)
    report = shadow_report()
    assert report["counts"]["disagree"] == 1
    assert report["disagreements"][0]["shadow_operation"] == str(shadow.id)
    assert report["disagreements"][0]["detail"] == {"same_terminal_status": True,
                                                    "same_result_digest": False}
    assert OutboxEvent.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_tool_with_side_effects_is_never_shadowed(server: ToolServer, mcp_url: str) -> None:
    rollout_configure(server_name="ref", tool_name="write_value", shadow=True,
                      actor="test", reason="try to shadow a write")
    before = peer_stats(mcp_url)
    op = submit_tool_call("ref", "write_value", "write-1", seconds=0, value="v")
    assert op.executor_path == "legacy" and op.state == State.ACCEPTED
    assert not Operation.objects.filter(shadow=True).exists()
    after = peer_stats(mcp_url)
    assert after["tasks_created"] == before["tasks_created"]
    assert after["tool_calls"]["write_value"] == before["tool_calls"].get("write_value", 0) + 1


@pytest.mark.django_db(transaction=True)
def test_submit_that_chose_tasks_before_a_rollback_commits_is_refused_after(
    server: ToolServer, mcp_url: str
) -> None:
    """The path is chosen from an unlocked read; the insert re-checks it under the config lock.
    A rollback holding that lock when the submit arrives wins, and nothing reaches the server."""
    from tests.concurrency import submit_racing_a_rollback
    from toolops.errors import SubmitRefused

    rollout_configure(server_name="ref", canary_percent=100.0, actor="t", reason="all tasks")
    before = peer_stats(mcp_url)["tasks_created"]
    result = submit_racing_a_rollback(lambda: submit_sleep("ref", node="race-1", value="v"))
    assert len(result) == 1 and isinstance(result[0], SubmitRefused), result
    assert not Operation.objects.filter(call_node_id="race-1").exists()
    assert peer_stats(mcp_url)["tasks_created"] == before
