"""Fault cases 6-10 (cases 1-5: test_fault_cases.py): each fault injected by the scriptable
layer in the real HTTP path in front of the reference SDK server, ledger on PostgreSQL, then the
same five invariants (conftest.assert_invariants)."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from adapters import NotFoundError, adapter_for
from ledger.models import Operation, ReconciliationItem, TerminalReceipt, ToolServer
from ledger.states import State
from tests.concurrency import poll_in_thread
from tests.faults.conftest import (
    assert_invariants,
    claim_now,
    kinds,
    settle,
    submit,
    wait_server_status,
)
from tests.peers.fault_transport import FaultTransport, Rule
from tests.peers.launch import peer_stats
from toolops.services.connections import adapter_for_server
from toolops.services.executors import executor_claim_due, executor_lease_owner, executor_run
from toolops.services.observe import operation_poll
from toolops.services.rollout import rollout_move

TASK_NOT_FOUND = -32602  # the SDK's "unknown task" (invalid params) on tasks/get and tasks/result


def _not_found(message: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": message["id"],
            "error": {"code": TASK_NOT_FOUND, "message": "Task not found"}}


def _poll_once(op: Operation, owner: str = "w") -> str:
    claim_now(op, owner)
    return operation_poll(operation_id=op.id, lease_owner=owner)


# -- 6. tasks/result lost, or truncated, after tasks/get said completed ---------------------------

@pytest.mark.django_db
@pytest.mark.parametrize("action", ["drop", "truncate"])
def test_case6_result_lost_or_truncated_after_completed(
        faults: FaultTransport, server: ToolServer, mcp_url: str, action: str) -> None:
    op = submit(server, seconds=0.2, value="c6")
    wait_server_status(server, op.remote_id, {"completed"})
    fault = faults.script(Rule(action=action, method="tasks/result", task_id=op.remote_id))
    assert _poll_once(op) == "result_fetch_error"
    assert fault.fired == 1
    row = Operation.objects.get(id=op.id)
    # Completed was seen, but nothing advances until its result is in hand.
    assert row.state == State.FETCHING_RESULT and row.terminal_status == "completed"
    assert not row.result_digest and "result_fetched" not in kinds(op)
    assert not TerminalReceipt.objects.filter(operation=op).exists()
    assert_invariants(mcp_url=mcp_url, ops=[op])
    settle()
    row.refresh_from_db()
    assert row.state == State.ACCEPTED and row.result is not None
    assert row.result["payload"]["content"][0]["text"] == "c6"
    assert faults.methods.count("tasks/result") == 2  # lost once, fetched again
    assert_invariants(mcp_url=mcp_url, ops=[op])


# -- 7. an observation from an old execution epoch ------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_case7_observation_from_an_old_execution_epoch(
        faults: FaultTransport, server: ToolServer, mcp_url: str) -> None:
    op = submit(server, seconds=0.2, value="c7")
    assert op.executor_path == "tasks" and op.execution_epoch == 1
    wait_server_status(server, op.remote_id, {"completed"})
    hold = faults.script(Rule(action="hold", method="tasks/get", task_id=op.remote_id))
    owner = executor_lease_owner(path="tasks")
    Operation.objects.filter(id=op.id).update(next_poll_at=timezone.now())
    assert executor_claim_due(path="tasks", owner=owner) == [op.id]
    out: list[str] = []
    worker = poll_in_thread(op, owner, out)  # the epoch-1 worker
    try:
        assert hold.wait_held()  # the epoch-1 worker holds "completed"
        rollout_move(to_path="legacy", reason="fault case 7", actor="test", server_name=server.name)
    finally:
        hold.release()
        worker.join(30)
    assert out == ["stale_epoch"]
    row = Operation.objects.get(id=op.id)
    assert (row.execution_epoch, row.executor_path, row.state) == (2, "legacy", State.WORKING)
    assert "terminal_observed" not in kinds(op) and "stale_epoch_refused" in kinds(op)
    assert not TerminalReceipt.objects.filter(operation=op).exists()
    # The new epoch's executor continues the same remote task and accepts it.
    executor_run(path="legacy", until_idle=True, max_seconds=30)
    row.refresh_from_db()
    assert row.state == State.ACCEPTED
    assert TerminalReceipt.objects.get(operation=op).execution_epoch == 2
    assert_invariants(mcp_url=mcp_url, ops=[op])


# -- 8. task id misuse ----------------------------------------------------------------------------

@pytest.mark.django_db
def test_case8_answer_about_another_task_is_refused(
        faults: FaultTransport, server: ToolServer, mcp_url: str) -> None:
    ours = submit(server, seconds=3, value="ours")
    other = submit(server, seconds=0.1, value="other")
    wait_server_status(server, other.remote_id, {"completed"})

    def about_other(message: dict[str, Any]) -> dict[str, Any]:
        return {**message, "result": {**message["result"], "taskId": other.remote_id,
                                      "status": "completed"}}

    misuse = faults.script(Rule(action="rewrite", method="tasks/get", task_id=ours.remote_id,
                                rewrite=about_other))
    assert _poll_once(ours) == "poll_error"
    assert misuse.fired == 1
    row = Operation.objects.get(id=ours.id)
    assert row.state == State.WORKING and not row.terminal_status
    assert "terminal_observed" not in kinds(ours)
    settle()
    for op, value in ((ours, "ours"), (other, "other")):
        op.refresh_from_db()
        assert op.state == State.ACCEPTED and op.result is not None
        assert op.result["payload"]["content"][0]["text"] == value
    assert_invariants(mcp_url=mcp_url, ops=[ours, other])


@pytest.mark.django_db
def test_case8_task_id_from_another_session(
        faults: FaultTransport, server: ToolServer, mcp_url: str) -> None:
    # A task created in another session (another client of the same server).
    foreign_client = adapter_for(version=server.adapter_version, url=mcp_url, session_id=None)
    try:
        foreign_client.negotiate()
        foreign = foreign_client.submit(tool="sleep_then_complete",
                                        arguments={"seconds": 0.1, "value": "foreign"},
                                        ttl_ms=60_000, submission_key=f"foreign-{uuid.uuid4()}")
        assert foreign.task is not None
        foreign_id = foreign.task.remote_id
        assert getattr(foreign_client, "session_id", None) != server.session_id
    finally:
        foreign_client.close()

    def foreign_task(message: dict[str, Any]) -> dict[str, Any]:
        result = message["result"]
        return {**message, "result": {**result, "task": {**result["task"], "taskId": foreign_id}}}

    misuse = faults.script(Rule(action="rewrite", method="tools/call", rewrite=foreign_task))
    op = submit(server, seconds=0.1, value="ours")
    assert misuse.fired == 1 and op.remote_id == foreign_id
    settle()
    op.refresh_from_db()
    # Our session does not know that task: UNKNOWN, never the foreign task's result.
    assert op.state == State.RECONCILIATION_REQUIRED and not op.result_digest
    assert ReconciliationItem.objects.get(operation=op).evidence["detail"]["classification"] == \
        "UNKNOWN"
    assert not TerminalReceipt.objects.filter(operation=op).exists()
    assert_invariants(mcp_url=mcp_url, ops=[op])


# -- 9. 404 before and after expiry ---------------------------------------------------------------

@pytest.mark.django_db
def test_case9_404_before_expiry(faults: FaultTransport, server: ToolServer, mcp_url: str) -> None:
    op = submit(server, seconds=3, value="c9", ttl_ms=60_000)
    gone = faults.script(Rule(action="rewrite", method="tasks/get", task_id=op.remote_id,
                              rewrite=_not_found))
    assert _poll_once(op) == "not_found"
    assert gone.fired == 1
    row = Operation.objects.get(id=op.id)
    # Before expiry a 404 proves nothing: UNKNOWN (never NOT_FOUND_SAFE, never a resubmit).
    assert row.state == State.RECONCILIATION_REQUIRED
    assert row.expires_at is not None and row.expires_at > timezone.now()
    item = ReconciliationItem.objects.get(operation=op)
    assert item.reason == "not_found_unknown"
    assert item.evidence["detail"]["classification"] == "UNKNOWN"
    assert not TerminalReceipt.objects.filter(operation=op).exists()
    assert_invariants(mcp_url=mcp_url, ops=[op])


@pytest.mark.django_db
def test_case9_404_after_expiry(faults: FaultTransport, server: ToolServer, mcp_url: str) -> None:
    op = submit(server, seconds=0.1, value="c9-late", ttl_ms=1000)
    # Nobody looked in time (workers down); our own budget was still open.
    # (Not polled for a day, rather than unscheduled: op_open_row_scheduled forbids that.)
    Operation.objects.filter(id=op.id).update(next_poll_at=timezone.now() + timedelta(days=1),
                                              expires_at=timezone.now() + timedelta(hours=1))
    adapter = adapter_for_server(server=server)
    deadline = time.monotonic() + 30
    while True:  # the server purges the task after its ttl
        try:
            adapter.get(remote_id=op.remote_id)
        except NotFoundError:
            break
        assert time.monotonic() < deadline, "the server never expired the task"
        time.sleep(0.2)
    seen = len(faults.log)
    assert _poll_once(op) == "not_found"
    # The server's own "unknown task" answer, passed through the layer untouched.
    assert ("tasks/get", op.remote_id, 200) in faults.log[seen:]
    row = Operation.objects.get(id=op.id)
    assert row.state == State.RECONCILIATION_REQUIRED and not row.result_digest
    assert ReconciliationItem.objects.get(operation=op).reason == "not_found_unknown"
    assert not TerminalReceipt.objects.filter(operation=op).exists()
    assert_invariants(mcp_url=mcp_url, ops=[op])


@pytest.mark.django_db
def test_case9_result_404_after_completed(faults: FaultTransport, server: ToolServer,
                                          mcp_url: str) -> None:
    """The task expires between `tasks/get` (completed) and `tasks/result` (404)."""
    op = submit(server, seconds=0.1, value="c9-result")
    wait_server_status(server, op.remote_id, {"completed"})
    faults.script(Rule(action="rewrite", method="tasks/result", task_id=op.remote_id,
                       rewrite=_not_found))
    assert _poll_once(op) == "result_not_found"
    row = Operation.objects.get(id=op.id)
    assert row.state == State.RECONCILIATION_REQUIRED and row.terminal_status == "completed"
    assert not row.result_digest and "accepted" not in kinds(op)
    assert not TerminalReceipt.objects.filter(operation=op).exists()
    assert_invariants(mcp_url=mcp_url, ops=[op])


# -- 10. 429 and 503 on polls ---------------------------------------------------------------------

@pytest.mark.django_db
def test_case10_429_and_503_on_polls(faults: FaultTransport, server: ToolServer,
                                     mcp_url: str) -> None:
    op = submit(server, seconds=0.3, value="c10")
    wait_server_status(server, op.remote_id, {"completed"})
    limited = faults.script(Rule(action="status", method="tasks/get", task_id=op.remote_id,
                                 status=429, headers={"Retry-After": "1"}))
    unavailable = faults.script(Rule(action="status", method="tasks/get", task_id=op.remote_id,
                                     status=503))
    before = timezone.now()
    assert _poll_once(op) == "poll_error"
    row = Operation.objects.get(id=op.id)
    # The task is completed on the server, but a 429 is no observation: nothing advanced, and
    # the next poll waits at least the Retry-After.
    assert row.state == State.WORKING and not row.terminal_status
    assert row.next_poll_at is not None
    assert row.next_poll_at >= before + timedelta(seconds=1)
    assert _poll_once(op) == "poll_error"
    row.refresh_from_db()
    assert row.state == State.WORKING and not row.terminal_status
    assert (limited.fired, unavailable.fired) == (1, 1)
    assert_invariants(mcp_url=mcp_url, ops=[op])
    settle()
    row.refresh_from_db()
    assert row.state == State.ACCEPTED and row.terminal_status == "completed"
    assert kinds(op).count("poll_error") == 2
    assert peer_stats(mcp_url)["submission_keys"][op.submission_key] == 1
    assert_invariants(mcp_url=mcp_url, ops=[op])
