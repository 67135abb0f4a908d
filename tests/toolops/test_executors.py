"""Executor paths and execution epochs (issue 9): which path owns a row, and how a worker or a
claim of an older epoch is refused and recorded. Real transactions and threads on PostgreSQL."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from ledger.errors import AcceptanceRefused
from ledger.models import Operation, OperationEvent, TerminalReceipt, ToolServer
from ledger.services.acceptance import operation_accept_terminal
from ledger.states import State
from toolops.services.executors import (
    executor_claim_due,
    executor_lease_owner,
    executor_path_for_mode,
)
from toolops.services.observe import operation_poll
from toolops.services.rollout import operation_hand_over_locked
from toolops.services.servers import server_add
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server(mcp_url: str) -> ToolServer:
    return server_add(name="ref", url=mcp_url, sync_bounds={"quick_sync": 5.0})


def _working(node: str, seconds: float = 2.0) -> Operation:
    return operation_submit(server_name="ref", tool_name="sleep_then_complete", call_node_id=node,
                            arguments={"seconds": seconds, "value": node}, ttl_ms=60_000)


def _due(op: Operation) -> None:
    Operation.objects.filter(id=op.id).update(next_poll_at=timezone.now())


def test_each_row_records_its_executor_path(server: ToolServer) -> None:
    sync = operation_submit(server_name="ref", tool_name="quick_sync", call_node_id="s",
                            arguments={"value": "x"})
    task = _working("t", seconds=0)
    assert (sync.execution_mode, sync.executor_path) == ("sync", "legacy")
    assert (task.execution_mode, task.executor_path) == ("task", "tasks")
    assert executor_path_for_mode(mode="sync") == "legacy"


def test_claims_stay_inside_their_path(server: ToolServer) -> None:
    op = _working("claim")
    _due(op)
    assert executor_claim_due(path="legacy", owner=executor_lease_owner(path="legacy")) == []
    owner = executor_lease_owner(path="tasks")
    assert executor_claim_due(path="tasks", owner=owner) == [op.id]
    with pytest.raises(ValueError):
        executor_claim_due(path="tasks", owner="legacy:abc")


def test_worker_of_the_other_path_is_refused_and_recorded(server: ToolServer) -> None:
    op = _working("ns")
    _due(op)
    owner = executor_lease_owner(path="legacy")
    # A legacy-namespace lease on a tasks row (e.g. a stray claim by another dispatcher version).
    until = timezone.now() + timedelta(seconds=30)
    Operation.objects.filter(id=op.id).update(lease_owner=owner, lease_expires_at=until)
    seq = Operation.objects.get(id=op.id).observation_seq
    assert operation_poll(operation_id=op.id, lease_owner=owner) == "stale_epoch"
    refused = OperationEvent.objects.filter(operation_id=op.id, kind="stale_epoch_refused")
    assert refused.count() == 1 and refused.get().data["source"] == "worker_start"
    assert refused.get().data["row_path"] == "tasks"
    assert Operation.objects.get(id=op.id).observation_seq == seq  # nothing observed for it


def test_acceptance_with_an_older_epoch_is_refused_and_recorded(server: ToolServer) -> None:
    op = operation_submit(server_name="ref", tool_name="sleep_then_complete", call_node_id="acc",
                          arguments={"seconds": 0, "value": "x"}, ttl_ms=60_000)
    # Bring it to FETCHING_RESULT with a digest through the real path, but stop before accepting:
    time.sleep(0.3)
    owner = executor_lease_owner(path="tasks")
    _due(op)
    executor_claim_due(path="tasks", owner=owner)
    with transaction.atomic():
        locked = Operation.objects.select_for_update().get(id=op.id)
        operation_hand_over_locked(op=locked, to_path="legacy", reason="t", actor="t",
                                   now=timezone.now())
    row = Operation.objects.get(id=op.id)
    assert row.execution_epoch == 2
    with pytest.raises(AcceptanceRefused) as err:
        operation_accept_terminal(
            operation_id=op.id, call_node_id=row.call_node_id, request_digest=row.request_digest,
            remote_id=row.remote_id, descriptor_version=row.descriptor_version, execution_epoch=1,
            cancel_generation=row.cancel_generation, terminal_status="completed",
            result_digest=row.result_digest,
        )
    assert err.value.field in ("execution_epoch", "state")
    assert OperationEvent.objects.filter(operation_id=op.id, kind="acceptance_refused").exists()
    assert not TerminalReceipt.objects.filter(operation_id=op.id).exists()


def test_worker_caught_mid_poll_by_an_epoch_bump_writes_nothing(server: ToolServer) -> None:
    """The worker passes its lease check and asks the server; meanwhile the hand-over commits.
    Its observation UPDATE (guarded on epoch) then matches nothing, and the refusal is recorded."""
    op = _working("mid", seconds=3.0)
    _due(op)
    owner = executor_lease_owner(path="tasks")
    assert executor_claim_due(path="tasks", owner=owner) == [op.id]
    seq_before = Operation.objects.get(id=op.id).observation_seq
    outcome: list[str] = []
    locked = threading.Event()
    release = threading.Event()

    def hold_and_bump() -> None:
        try:
            with transaction.atomic():
                row = Operation.objects.select_for_update().get(id=op.id)
                locked.set()
                release.wait(10)  # the worker is now blocked on this row lock
                operation_hand_over_locked(op=row, to_path="legacy", reason="mid", actor="t",
                                           now=timezone.now())
        finally:
            connection.close()

    def worker() -> None:
        try:
            outcome.append(operation_poll(operation_id=op.id, lease_owner=owner))
        finally:
            connection.close()

    bumper = threading.Thread(target=hold_and_bump)
    bumper.start()
    assert locked.wait(10)
    w = threading.Thread(target=worker)
    w.start()
    # Wait until the worker's guarded UPDATE is queued behind the lock (pg_locks shows it).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
            if cur.fetchone()[0] > 0:
                break
        time.sleep(0.05)
    release.set()
    bumper.join(15)
    w.join(15)
    assert outcome == ["stale_epoch"]
    row = Operation.objects.get(id=op.id)
    assert (row.execution_epoch, row.executor_path, row.observation_seq) == (2, "legacy", seq_before)
    refused = OperationEvent.objects.get(operation_id=op.id, kind="stale_epoch_refused")
    assert (refused.data["claimed_epoch"], refused.data["row_epoch"]) == (1, 2)
    assert not OperationEvent.objects.filter(operation_id=op.id, kind="observed").exists()
    assert row.state == State.WORKING
