"""The fault layer installed in the executor, and the five invariants every fault case checks.

Faults go through tests/peers/fault_transport.py in front of the real reference SDK server;
the executor's adapters use it via `connections_use_transport`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.models import EffectReconciliation, Operation, OperationEvent, TerminalReceipt, ToolServer
from ledger.selectors import operation_find
from ledger.states import State
from tests.peers.fault_transport import FaultTransport
from tests.peers.launch import peer_stats
from toolops.runner import run_embedded
from toolops.services.connections import adapter_for_server
from toolops.services.dispatch import operations_claim_due
from toolops.services.servers import server_add
from toolops.services.submit import operation_submit

UNKNOWN_STATES = (State.SUBMISSION_UNKNOWN, State.RECONCILIATION_REQUIRED)


def server_for(url: str, name: str = "ref") -> ToolServer:
    srv = server_add(name=name, url=url)
    # A generous cap: these cases are about the server's answers, not our own pacing.
    ToolServer.objects.filter(pk=srv.pk).update(max_qps=1000.0)
    srv.refresh_from_db()
    return srv


@pytest.fixture
def server(mcp_url: str, faults: FaultTransport) -> ToolServer:
    return server_for(mcp_url)


def submit(server: ToolServer, *, tool: str = "sleep_then_complete", ttl_ms: int = 60_000,
           **arguments: object) -> Operation:
    return operation_submit(server_name=server.name, tool_name=tool,
                            call_node_id=f"f-{uuid.uuid4().hex[:10]}", arguments=dict(arguments),
                            ttl_ms=ttl_ms)


def settle(max_seconds: float = 30.0) -> None:
    run_embedded(until_idle=True, max_seconds=max_seconds)


def claim_now(op: Operation, owner: str) -> None:
    """Make the row due and claim it for `owner` (a real claim: lease, poll_attempts). A lease
    still held is taken as run out (a stuck worker), which is how a second poller gets the row."""
    # Earliest due of all rows, and a batch of one: other rows of the test stay unclaimed.
    an_hour_ago = timezone.now() - timedelta(hours=1)
    Operation.objects.filter(id=op.id).update(next_poll_at=an_hour_ago, lease_expires_at=an_hour_ago)
    assert operations_claim_due(owner=owner, limit=1) == [op.id]


def wait_server_status(server: ToolServer, remote_id: str, wanted: set[str],
                       timeout_s: float = 20.0) -> str:
    """Ask the server (through the same layer) until the task reaches one of `wanted`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = adapter_for_server(server=server).get(remote_id=remote_id).status
        if status in wanted:
            return status
        time.sleep(0.1)
    raise AssertionError(f"task {remote_id} never reached {wanted}")


def wait_for(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def kinds(op: Operation) -> list[str]:
    return list(OperationEvent.objects.filter(operation_id=op.id).order_by("seq")
                .values_list("kind", flat=True))


def assert_invariants(*, mcp_url: str, ops: Sequence[Operation]) -> None:
    """The five ledger invariants, for the operations of one test."""
    stats = peer_stats(mcp_url)
    for op in ops:
        row = Operation.objects.get(id=op.id)
        events = list(OperationEvent.objects.filter(operation_id=row.id).order_by("seq"))
        seq_of = {e.kind: e.seq for e in reversed(events)}  # first occurrence of each kind
        # 1. at most one terminal receipt per call node (across epochs and attempts)
        assert TerminalReceipt.objects.filter(call_node_id=row.call_node_id).count() <= 1, row
        # 2. completed/failed never advances before its result was fetched
        receipt = TerminalReceipt.objects.filter(operation_id=row.id).first()
        if receipt is not None and receipt.terminal_status in ("completed", "failed"):
            assert "result_fetched" in seq_of and "accepted" in seq_of, [e.kind for e in events]
            assert seq_of["result_fetched"] < seq_of["accepted"]
            assert row.result_digest and receipt.result_digest == row.result_digest
        if row.state == State.ACCEPTED and row.terminal_status in ("completed", "failed"):
            assert receipt is not None
        # 3. a late completion after an accepted cancel never advances: the receipt says
        #    cancelled, and any late effect is an EffectReconciliation row only
        if row.state == State.CANCELLED_ACCEPTED:
            assert receipt is not None and receipt.terminal_status == "cancelled"
            assert receipt.payload is None
        if EffectReconciliation.objects.filter(operation_id=row.id).exists():
            assert row.state == State.CANCELLED_ACCEPTED and receipt is not None
            assert receipt.terminal_status == "cancelled"
        # 4. every UNKNOWN row is findable by task id and by submission key
        if row.state in UNKNOWN_STATES:
            found = operation_find(ref=row.submission_key)
            assert found is not None and found.id == row.id
            if row.remote_id:
                found = operation_find(ref=row.remote_id)
                assert found is not None and found.id == row.id
        # 5. one operation per submission key on the server (we never resend)
        assert stats["submission_keys"].get(row.submission_key) == 1, (
                row.submission_key, stats["submission_keys"].get(row.submission_key))
