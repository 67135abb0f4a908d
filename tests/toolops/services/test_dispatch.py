"""Dispatcher claims on PostgreSQL (skip_locked, leases, expiry) and out-of-order observations
from two pollers, with real threads and real transactions."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from ledger.models import Operation, OperationEvent, TerminalReceipt, ToolServer
from ledger.states import State
from tests.ledger.factories import OperationFactory, ToolServerFactory
from tests.peers.fault_transport import FaultTransport
from toolops.services.connections import connections_use_transport
from toolops.services.dispatch import operations_claim_due, operations_dispatch_due
from toolops.services.observe import operation_poll
from toolops.services.servers import server_add
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db(transaction=True)

ROWS = 3000


def _bulk_due_rows(n: int, *, state: State = State.WORKING) -> list[uuid.UUID]:
    server = ToolServerFactory()
    now = timezone.now()
    rows = OperationFactory.build_batch(n, server=server, state=state,
                                        next_poll_at=now - timedelta(seconds=1))
    Operation.objects.bulk_create(rows, batch_size=1000)
    return [r.id for r in rows]


def test_two_concurrent_dispatchers_never_lease_one_row_twice() -> None:
    ids = set(_bulk_due_rows(ROWS))
    claimed: dict[str, list[uuid.UUID]] = {"a": [], "b": []}
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def dispatcher(name: str) -> None:
        try:
            barrier.wait()
            while True:
                batch = operations_claim_due(owner=f"owner-{name}", limit=100)
                if not batch:
                    return
                claimed[name].extend(batch)
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=dispatcher, args=(n,)) for n in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    a, b = set(claimed["a"]), set(claimed["b"])
    assert len(a) == len(claimed["a"]) and len(b) == len(claimed["b"])
    assert not a & b, "one row leased by both dispatchers"
    assert a | b == ids
    # Both really ran at once (skip_locked let the second take other rows, not wait).
    assert a and b
    # The ledger agrees with who claimed what, and every row was claimed exactly once.
    owners = dict(Operation.objects.values_list("id", "lease_owner"))
    assert all(owners[i] == "owner-a" for i in a) and all(owners[i] == "owner-b" for i in b)
    assert set(Operation.objects.values_list("poll_attempts", flat=True)) == {1}


def test_a_lost_workers_lease_expires_and_the_row_is_claimed_again(settings) -> None:
    settings.TOOLOPS_LEASE_SECONDS = 0.5
    (op_id,) = _bulk_due_rows(1)
    assert operations_claim_due(owner="lost-worker") == [op_id]
    # While the lease holds, nobody else gets the row.
    assert operations_claim_due(owner="other") == []
    time.sleep(0.6)
    assert operations_claim_due(owner="other") == [op_id]
    # The lost worker, should it wake up, finds its claim gone and writes nothing.
    assert operation_poll(operation_id=op_id, lease_owner="lost-worker") == "stale_lease"
    assert Operation.objects.get(id=op_id).poll_attempts == 2


def test_input_required_rows_are_not_polled_but_cancel_requested_rows_are() -> None:
    (paused,) = _bulk_due_rows(1, state=State.INPUT_REQUIRED)
    (cancelling,) = _bulk_due_rows(1, state=State.CANCEL_REQUESTED)
    assert operations_claim_due(owner="d") == [cancelling]
    assert Operation.objects.get(id=paused).lease_owner == ""


def test_dispatch_enqueues_only_after_the_claim_committed() -> None:
    ids = set(_bulk_due_rows(5))
    seen: list[tuple[uuid.UUID, str]] = []

    def enqueue(op_id: uuid.UUID, owner: str) -> None:
        # on_commit: the claim is visible to any other connection by now.
        assert Operation.objects.get(id=op_id).lease_owner == owner
        seen.append((op_id, owner))

    assert operations_dispatch_due(enqueue=enqueue) == 5
    assert {i for i, _ in seen} == ids and len({o for _, o in seen}) == 1


# -- out-of-order observations over real HTTP ---------------------------------------------------

@pytest.fixture
def held() -> Iterator[tuple[FaultTransport, threading.Event, threading.Event]]:
    """A transport that holds the FIRST tasks/get reply until released."""
    transport = FaultTransport()
    reached, release = threading.Event(), threading.Event()
    first = threading.Lock()
    state = {"held": False}

    def before_reply(method: str) -> None:
        if method != "tasks/get":
            return
        with first:
            if state["held"]:
                return
            state["held"] = True
        reached.set()
        release.wait(timeout=60)

    transport.before_reply = before_reply
    connections_use_transport(lambda _server: transport)
    yield transport, reached, release
    release.set()
    connections_use_transport(None)
    transport.close()


def _server(mcp_url: str) -> ToolServer:
    srv = server_add(name=f"ooo-{uuid.uuid4().hex[:6]}", url=mcp_url)
    ToolServer.objects.filter(pk=srv.pk).update(max_qps=1000.0)
    return srv


def _start_held_poll(op_id: uuid.UUID, owner: str, out: dict[str, str],
                     reached: threading.Event) -> threading.Thread:
    Operation.objects.filter(id=op_id).update(next_poll_at=timezone.now())
    assert operations_claim_due(owner=owner) == [op_id]

    def run() -> None:
        try:
            out["a"] = operation_poll(operation_id=op_id, lease_owner=owner)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    assert reached.wait(timeout=30), "the first poll's reply was not held"
    return thread


def _reclaim(op_id: uuid.UUID, owner: str) -> None:
    """The first claim's lease runs out (a stuck worker) and the row is claimed again."""
    Operation.objects.filter(id=op_id).update(lease_expires_at=timezone.now(),
                                              next_poll_at=timezone.now())
    assert operations_claim_due(owner=owner) == [op_id]


@pytest.mark.parametrize("second_owner", ["same-owner", "other-owner"])
def test_an_older_observation_arriving_after_a_newer_one_changes_nothing(
    mcp_url: str, held: tuple[FaultTransport, threading.Event, threading.Event], second_owner: str
) -> None:
    """Same owner: the worker that issued the old poll holds the row again (a re-claim by the same
    owner, e.g. the embedded runner), so the lease matches and only the issued sequence refuses
    the old answer. Other owner: a stale lease."""
    _, reached, release = held
    srv = _server(mcp_url)
    op = operation_submit(server_name=srv.name, tool_name="sleep_then_complete",
                          call_node_id=f"n-{uuid.uuid4().hex[:6]}",
                          arguments={"seconds": 30, "value": "v"}, ttl_ms=60_000)
    out: dict[str, str] = {}
    first = _start_held_poll(op.id, "owner-1", out, reached)
    newer_owner = "owner-1" if second_owner == "same-owner" else "owner-2"
    _reclaim(op.id, newer_owner)
    assert operation_poll(operation_id=op.id, lease_owner=newer_owner) == "working"
    # The newer owner claims the row for its next poll before the old answer lands.
    _reclaim(op.id, newer_owner)
    after_newer = Operation.objects.get(id=op.id)
    events_after_newer = OperationEvent.objects.filter(operation=op).count()
    release.set()
    first.join(timeout=30)
    assert out["a"] in ("stale_observation", "stale_lease")
    if second_owner == "same-owner":
        assert out["a"] == "stale_observation"  # the lease matched; the sequence refused it
    row = Operation.objects.get(id=op.id)
    assert row.observation_seq == after_newer.observation_seq
    assert row.next_poll_at == after_newer.next_poll_at and row.updated_at == after_newer.updated_at
    assert OperationEvent.objects.filter(operation=op).count() == events_after_newer


def test_a_late_working_answer_never_regresses_a_terminal_state(
    mcp_url: str, held: tuple[FaultTransport, threading.Event, threading.Event]
) -> None:
    _, reached, release = held
    srv = _server(mcp_url)
    op = operation_submit(server_name=srv.name, tool_name="sleep_then_complete",
                          call_node_id=f"n-{uuid.uuid4().hex[:6]}",
                          arguments={"seconds": 1.0, "value": "late"}, ttl_ms=60_000)
    out: dict[str, str] = {}
    first = _start_held_poll(op.id, "owner-1", out, reached)  # holds a "working" answer
    time.sleep(1.5)  # the task completes on the server meanwhile
    _reclaim(op.id, "owner-1")
    assert operation_poll(operation_id=op.id, lease_owner="owner-1") == "accepted:completed"
    release.set()
    first.join(timeout=30)
    assert out["a"] == "stale_observation"
    row = Operation.objects.get(id=op.id)
    assert row.state == State.ACCEPTED and row.server_state == "completed"
    assert TerminalReceipt.objects.filter(operation=op).count() == 1
    kinds = list(OperationEvent.objects.filter(operation=op).order_by("seq")
                 .values_list("kind", flat=True))
    assert kinds[-1] == "accepted" and "observed" not in kinds[kinds.index("terminal_observed"):]


@pytest.fixture
def pushing(faults: FaultTransport) -> FaultTransport:
    return faults  # the shared fault transport (tests/conftest.py), named for what it does here


def test_a_pushed_status_polls_sooner_but_is_never_a_terminal_fact(
    mcp_url: str, pushing: FaultTransport
) -> None:
    srv = _server(mcp_url)
    ops = [operation_submit(server_name=srv.name, tool_name="sleep_then_complete",
                            call_node_id=f"n-push-{i}-{uuid.uuid4().hex[:6]}",
                            arguments={"seconds": 30, "value": "v"}, ttl_ms=60_000)
           for i in range(2)]
    polled, pushed = ops
    later = timezone.now() + timedelta(seconds=60)
    Operation.objects.filter(id=pushed.id).update(next_poll_at=later)
    events_before = OperationEvent.objects.filter(operation=pushed).count()
    pushing.push_before_reply(method="tasks/get", notification={
        "jsonrpc": "2.0", "method": "notifications/tasks/status",
        "params": {"taskId": pushed.remote_id, "status": "completed", "createdAt": "x",
                   "lastUpdatedAt": "x", "ttl": 60000}})
    Operation.objects.filter(id=polled.id).update(next_poll_at=timezone.now())
    assert operations_claim_due(owner="p") == [polled.id]
    assert operation_poll(operation_id=polled.id, lease_owner="p") == "working"
    row = Operation.objects.get(id=pushed.id)
    assert row.next_poll_at is not None and row.next_poll_at <= timezone.now()
    # a hint only: the pushed "completed" wrote no state, no server status and no event
    assert row.state == State.WORKING and row.server_state == "working"
    assert row.terminal_status == ""
    assert OperationEvent.objects.filter(operation=pushed).count() == events_before
    # and the poll it triggers asks the server, which says the task is still working
    assert operations_claim_due(owner="q") == [pushed.id]
    assert operation_poll(operation_id=pushed.id, lease_owner="q") == "working"
