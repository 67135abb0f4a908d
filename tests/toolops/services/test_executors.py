"""Executor paths and execution epochs: which path owns a row, and how a worker or a
claim of an older epoch is refused and recorded. Real transactions and threads on PostgreSQL."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from ledger.errors import AcceptanceRefused
from ledger.models import Operation, OperationEvent, TerminalReceipt, ToolServer
from ledger.services.acceptance import operation_accept_terminal
from ledger.states import State
from tests.concurrency import poll_in_thread, wait_for_lock_waiter
from tests.ledger.factories import OperationFactory
from tests.peers.fault_transport import Fault, FaultTransport
from toolops.services.executors import (
    executor_claim_due,
    executor_lease_owner,
    executor_path_for_mode,
)
from toolops.services.observe import operation_poll
from toolops.services.rollout import operation_hand_over_locked
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server_options() -> dict[str, Any]:
    # A high QPS cap: these tests are about epochs and leases, and a poll refused its token
    # (rate_limited) right after the submit would never reach the epoch check.
    return {"sync_bounds": {"quick_sync": 5.0}, "max_qps": 200}


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


def test_acceptance_with_an_older_epoch_is_refused_and_recorded() -> None:
    """A result fetched and digested at epoch 1, handed over, then claimed at epoch 1: refused;
    the same claim at the row's epoch is the one receipt, in the new epoch's slot."""
    op = OperationFactory(state=State.FETCHING_RESULT, terminal_status="completed",
                          result={"kind": "result", "payload": {"v": 1}, "is_error": False},
                          result_digest="sha256:r1")
    with transaction.atomic():
        locked = Operation.objects.select_for_update().get(id=op.id)
        operation_hand_over_locked(op=locked, to_path="legacy", reason="t", actor="t",
                                   now=timezone.now())
    claim = {"operation_id": op.id, "call_node_id": op.call_node_id,
             "request_digest": op.request_digest, "remote_id": op.remote_id,
             "descriptor_version": op.descriptor_version, "cancel_generation": 0,
             "terminal_status": "completed", "result_digest": "sha256:r1"}
    with pytest.raises(AcceptanceRefused) as err:
        operation_accept_terminal(execution_epoch=1, **claim)
    assert err.value.field == "execution_epoch"
    refused = OperationEvent.objects.get(operation_id=op.id, kind="acceptance_refused")
    assert refused.data["field"] == "execution_epoch"
    assert not TerminalReceipt.objects.filter(operation_id=op.id).exists()
    receipt = operation_accept_terminal(execution_epoch=2, **claim)
    assert receipt.execution_epoch == 2
    assert TerminalReceipt.objects.filter(call_node_id=op.call_node_id).count() == 1


def test_a_shadow_row_never_takes_a_receipt() -> None:
    legacy = OperationFactory(state=State.ACCEPTED)
    shadow = OperationFactory(call_node_id=legacy.call_node_id, shadow=True, shadow_of=legacy,
                              state=State.FETCHING_RESULT, terminal_status="completed",
                              result={"kind": "result", "payload": 1, "is_error": False},
                              result_digest="sha256:s")
    with pytest.raises(AcceptanceRefused) as err:
        operation_accept_terminal(
            operation_id=shadow.id, call_node_id=shadow.call_node_id,
            request_digest=shadow.request_digest, remote_id=shadow.remote_id,
            descriptor_version=shadow.descriptor_version, execution_epoch=1, cancel_generation=0,
            terminal_status="completed", result_digest="sha256:s",
        )
    assert err.value.field == "shadow"
    assert not TerminalReceipt.objects.filter(operation_id=shadow.id).exists()


def _poll_caught_by_an_epoch_bump(*, op: Operation, owner: str) -> list[str]:
    """Poll `op` in a thread while another transaction holds its row lock; once the worker's
    guarded write queues behind that lock, the holder hands the row over (epoch + 1) and commits.
    Returns the poll's outcome."""
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

    bumper = threading.Thread(target=hold_and_bump)
    bumper.start()
    assert locked.wait(10)
    worker = poll_in_thread(op, owner, outcome)
    # Wait until the worker's guarded UPDATE is queued behind the lock (pg_locks shows it).
    wait_for_lock_waiter()
    release.set()
    bumper.join(15)
    worker.join(15)
    return outcome


def test_worker_caught_mid_poll_by_an_epoch_bump_writes_nothing(server: ToolServer) -> None:
    """The worker passes its lease check and asks the server; meanwhile the hand-over commits.
    Its observation UPDATE (guarded on epoch) then matches nothing, and the refusal is recorded."""
    op = _working("mid", seconds=3.0)
    _due(op)
    owner = executor_lease_owner(path="tasks")
    assert executor_claim_due(path="tasks", owner=owner) == [op.id]
    seq_before = Operation.objects.get(id=op.id).observation_seq
    assert _poll_caught_by_an_epoch_bump(op=op, owner=owner) == ["stale_epoch"]
    row = Operation.objects.get(id=op.id)
    assert (row.execution_epoch, row.executor_path, row.observation_seq) == (2, "legacy", seq_before)
    refused = OperationEvent.objects.get(operation_id=op.id, kind="stale_epoch_refused")
    assert (refused.data["claimed_epoch"], refused.data["row_epoch"]) == (1, 2)
    assert not OperationEvent.objects.filter(operation_id=op.id, kind="observed").exists()
    assert row.state == State.WORKING


@pytest.mark.parametrize("status", [503, 429])
def test_an_error_answer_caught_by_an_epoch_bump_is_refused_and_recorded(
    faults: FaultTransport, server: ToolServer, status: int
) -> None:
    """The server answers the poll with an error while the hand-over holds the row: the backoff
    UPDATE (guarded on epoch) matches nothing, and the refusal is recorded as for an answer."""
    op = _working("mid-error", seconds=3.0)
    _due(op)
    owner = executor_lease_owner(path="tasks")
    assert executor_claim_due(path="tasks", owner=owner) == [op.id]
    faults.inject(Fault("tasks/get", status))
    outcome = _poll_caught_by_an_epoch_bump(op=op, owner=owner)
    assert faults.pending_faults() == 0  # the error answer was the one the worker got
    assert outcome == ["stale_epoch"]
    row = Operation.objects.get(id=op.id)
    assert (row.execution_epoch, row.executor_path, row.poll_errors_in_row) == (2, "legacy", 0)
    refused = OperationEvent.objects.get(operation_id=op.id, kind="stale_epoch_refused")
    assert (refused.data["claimed_epoch"], refused.data["row_epoch"]) == (1, 2)
    assert not OperationEvent.objects.filter(operation_id=op.id, kind="poll_error").exists()
