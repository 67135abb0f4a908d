"""Batches polled concurrently on the process's poll threads, and rows held between polls, with
real PostgreSQL transactions, real threads and the reference SDK server."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.models import Operation, OperationEvent, TerminalReceipt, ToolServer
from ledger.selectors.rows import operations_load
from ledger.states import State
from tests.ledger.factories import OperationFactory, ToolServerFactory
from tests.peers.fault_transport import FaultTransport
from toolops.services import observe, poll_batch
from toolops.services.connections import connections_use_transport
from toolops.services.dispatch import (
    DispatchPass,
    operations_claim_due,
    operations_dispatch_due_batches,
    operations_dispatch_following_due,
)
from toolops.services.poll_batch import operations_poll_batch, poll_threads_stop
from toolops.services.servers import server_add
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db(transaction=True)

GRACE = 2.0


@pytest.fixture(autouse=True)
def _poll_threads(transactional_db: None) -> Iterator[None]:
    """Each test starts its process's poll threads afresh and stops them before the flush."""
    # All four threads at once: these tests are about the batch, not the adaptive gate
    # (tests/toolops/services/test_poll_concurrency.py).
    with override_settings(TOOLOPS_POLL_THREADS=4, TOOLOPS_POLL_ADAPTIVE=False,
                           TOOLOPS_POLL_HOLD_SECONDS=2.0, TOOLOPS_POLL_HOLD_GRACE_SECONDS=GRACE):
        yield
        poll_threads_stop()


@pytest.fixture
def server(mcp_url: str) -> ToolServer:
    srv = server_add(name=f"ref-{uuid.uuid4().hex[:6]}", url=mcp_url)
    # A cap far above these tests' rates: four polls in flight together never wait for a token.
    ToolServer.objects.filter(pk=srv.pk).update(max_qps=100_000.0)
    srv.refresh_from_db()
    return srv


def _submit(server: ToolServer, seconds: float) -> Operation:
    return operation_submit(server_name=server.name, tool_name="sleep_then_complete",
                            call_node_id=f"pb-{uuid.uuid4().hex[:10]}",
                            arguments={"seconds": seconds, "value": "v"}, ttl_ms=60_000)


def _claim_now(*ops: Operation, owner: str) -> list[uuid.UUID]:
    Operation.objects.filter(id__in=[op.id for op in ops]).update(
        next_poll_at=timezone.now() - timedelta(seconds=1))
    ids = operations_claim_due(owner=owner, limit=len(ops))
    assert sorted(ids) == sorted(op.id for op in ops)
    return ids


def _wait_for(predicate: Any, timeout_s: float = 10.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_a_batch_is_polled_concurrently_and_each_row_reaches_its_receipt(server: ToolServer) -> None:
    ops = [_submit(server, 0.2) for _ in range(4)]
    time.sleep(0.4)  # done on the server: the one poll settles each row
    # Each tasks/get answer waits until all four are in flight: a batch polled one row after
    # the other would break the barrier (its polls would fail and be rescheduled).
    barrier = threading.Barrier(4, timeout=5.0)
    transport = FaultTransport()
    transport.before_reply = lambda method: barrier.wait() if method == "tasks/get" else None
    connections_use_transport(lambda _server: transport)
    try:
        ids = _claim_now(*ops, owner="batch-a")
        counts = operations_poll_batch(operation_ids=ids, lease_owner="batch-a")
    finally:
        connections_use_transport(None)
    assert counts == {"accepted": 4}
    assert TerminalReceipt.objects.filter(operation_id__in=ids).count() == 4
    assert set(Operation.objects.filter(id__in=ids).values_list("lease_owner", flat=True)) == {""}


def test_a_crash_in_one_row_is_recorded_on_it_and_the_others_carry_on(
        server: ToolServer, monkeypatch: pytest.MonkeyPatch) -> None:
    ops = [_submit(server, 0.2) for _ in range(3)]
    time.sleep(0.4)
    bad = ops[1].id
    real = observe.operation_poll

    def poll(**kwargs: Any) -> str:
        if kwargs["operation_id"] == bad:
            raise KeyError("a bug in one row's cycle")
        return real(**kwargs)

    monkeypatch.setattr("toolops.services.observe.operation_poll", poll)
    ids = _claim_now(*ops, owner="batch-b")
    counts = operations_poll_batch(operation_ids=ids, lease_owner="batch-b")
    assert counts == {"accepted": 2, "executor_error": 1}
    crashed = Operation.objects.get(id=bad)
    assert crashed.state == State.WORKING and crashed.lease_owner == ""
    assert OperationEvent.objects.filter(operation_id=bad, kind="executor_error").count() == 1
    assert TerminalReceipt.objects.filter(operation_id__in=ids).exclude(operation_id=bad).count() == 2


def test_a_working_row_is_held_and_polled_again_in_process_until_accepted(server: ToolServer) -> None:
    op = _submit(server, 1.0)
    ids = _claim_now(op, owner="batch-c")
    counts = operations_poll_batch(operation_ids=ids, lease_owner="batch-c")
    assert counts == {"held": 1}
    row = Operation.objects.get(id=op.id)
    # The ledger says it all: the next poll time as usual, the lease kept just past it.
    assert row.lease_owner == "batch-c" and row.next_poll_at is not None
    assert row.lease_expires_at == row.next_poll_at + timedelta(seconds=GRACE)
    # Claimable by no one else meanwhile (the claim query is unchanged).
    assert operations_claim_due(owner="someone-else") == []
    # No dispatcher runs here: the holder thread polls the row to its receipt.
    assert _wait_for(lambda: TerminalReceipt.objects.filter(operation_id=op.id).exists())
    done = Operation.objects.get(id=op.id)
    assert done.state == State.ACCEPTED and done.lease_owner == ""
    assert done.poll_attempts >= 2  # each held poll is counted like a claim


@pytest.mark.parametrize("ahead", [0.6, 0.0])
def test_held_rows_due_close_together_share_one_renewal_and_each_is_polled_at_its_time(
        server: ToolServer, monkeypatch: pytest.MonkeyPatch, ahead: float) -> None:
    first = _submit(server, 1.5)
    time.sleep(0.2)
    second = _submit(server, 1.5)
    ids = _claim_now(first, second, owner="batch-r")
    renewals: list[tuple[float, list[uuid.UUID]]] = []
    real = poll_batch.operations_hold_renew

    def renew(*, ids: list[uuid.UUID], owner: str) -> dict[uuid.UUID, Operation]:
        renewals.append((time.time(), sorted(ids)))
        return real(ids=ids, owner=owner)

    monkeypatch.setattr(poll_batch, "operations_hold_renew", renew)
    asked: list[float] = []
    transport = FaultTransport()
    transport.before_reply = lambda method: asked.append(time.time()) if method == "tasks/get" else None
    connections_use_transport(lambda _server: transport)
    try:
        with override_settings(TOOLOPS_DISPATCH_AHEAD_SECONDS=ahead):
            assert operations_poll_batch(operation_ids=ids, lease_owner="batch-r") == {"held": 2}
            due_of = dict(Operation.objects.filter(id__in=ids).values_list("id", "next_poll_at"))
            due = sorted(due_of.values())
            assert due[1] > due[0]
            assert _wait_for(lambda: len(asked) >= 4)
    finally:
        connections_use_transport(None)
    # The second round of polls: each at or after its own time, never the later one early.
    second_round = sorted(asked)[2:4]
    assert second_round[0] >= due[0].timestamp() and second_round[1] >= due[1].timestamp()
    renewed_at, first_renewal = renewals[0]
    if ahead and (due[1] - due[0]).total_seconds() <= ahead:
        assert first_renewal == sorted(ids)  # one statement renewed both
    else:
        # Without a horizon a renewal takes only the rows due when the holder wakes: the first
        # alone if it wakes in time, both if a busy machine wakes it after the second's time too.
        assert all(due_of[op_id].timestamp() <= renewed_at for op_id in first_renewal)
        if renewed_at < due[1].timestamp():
            assert len(first_renewal) == 1


def test_with_holding_off_a_working_row_is_released(server: ToolServer) -> None:
    op = _submit(server, 1.0)
    ids = _claim_now(op, owner="batch-d")
    with override_settings(TOOLOPS_POLL_HOLD_SECONDS=0.0):
        assert operations_poll_batch(operation_ids=ids, lease_owner="batch-d") == {"working": 1}
    row = Operation.objects.get(id=op.id)
    assert row.lease_owner == "" and row.lease_expires_at is None and row.next_poll_at is not None


def test_a_held_row_whose_lease_was_taken_is_left_to_its_new_owner(server: ToolServer) -> None:
    op = _submit(server, 1.0)
    ids = _claim_now(op, owner="batch-e")
    assert operations_poll_batch(operation_ids=ids, lease_owner="batch-e") == {"held": 1}
    polls = Operation.objects.get(id=op.id).polls_count
    # Another worker owns the row now (its lease ran out and it was re-claimed).
    Operation.objects.filter(id=op.id).update(
        lease_owner="batch-other", lease_expires_at=timezone.now() + timedelta(seconds=30))
    time.sleep(1.5)  # past the held poll time
    row = Operation.objects.get(id=op.id)
    assert row.lease_owner == "batch-other" and row.polls_count == polls
    assert row.state == State.WORKING


def test_stopping_hands_back_held_rows_and_ends_the_threads(server: ToolServer) -> None:
    op = _submit(server, 5.0)
    ids = _claim_now(op, owner="batch-f")
    assert operations_poll_batch(operation_ids=ids, lease_owner="batch-f") == {"held": 1}
    due = Operation.objects.get(id=op.id).next_poll_at
    assert poll_threads_stop() == 1
    row = Operation.objects.get(id=op.id)
    assert row.lease_owner == "" and row.lease_expires_at is None and row.next_poll_at == due
    assert not [t for t in threading.enumerate() if t.name.startswith("toolops-poll")]


def test_the_dispatcher_claims_a_row_when_it_falls_due_within_its_tick() -> None:
    server = ToolServerFactory()
    soon = OperationFactory(server=server, state=State.WORKING,
                            next_poll_at=timezone.now() + timedelta(seconds=0.3))
    sent: list[tuple[list[uuid.UUID], str]] = []
    started = time.monotonic()
    claimed = operations_dispatch_following_due(
        seconds=1.0, dispatch_once=lambda: operations_dispatch_due_batches(
            enqueue_batch=lambda ids, owner, _early: sent.append((ids, owner)), batch_size=16))
    assert claimed == 1 and sent and sent[0][0] == [soon.id]
    assert time.monotonic() - started < 1.5


@pytest.mark.parametrize("behind", [False, True])
def test_after_a_pass_that_found_the_fleet_behind_the_next_one_waits_longer(behind: bool) -> None:
    passes: list[float] = []

    def once() -> DispatchPass:
        passes.append(time.monotonic())
        # A row due at once after every pass: only the gap spaces the passes.
        return DispatchPass(claimed=1, next_due_at=timezone.now(), read_next_due=True,
                            behind=behind)

    with override_settings(TOOLOPS_DISPATCH_MIN_GAP_SECONDS=0.02,
                           TOOLOPS_DISPATCH_BUSY_GAP_SECONDS=0.25):
        operations_dispatch_following_due(seconds=0.9, dispatch_once=once)
    gaps = [later - earlier for earlier, later in itertools.pairwise(passes)]
    assert gaps and min(gaps) >= (0.245 if behind else 0.0195)
    assert (len(passes) <= 4) if behind else (len(passes) >= 10)


@pytest.fixture
def cpu_to_spare(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The machine's spare CPU as the dispatcher and the worker see it, set by the test (yes by
    default)."""
    spare = [True]
    monkeypatch.setattr("toolops.services.dispatch.machine_cpu_to_spare", lambda: spare[0])
    monkeypatch.setattr("toolops.services.poll_batch.machine_cpu_to_spare", lambda: spare[0])
    return spare


@pytest.mark.usefixtures("cpu_to_spare")
def test_a_pass_claims_the_free_rows_due_within_its_horizon_and_says_when_each_is_due() -> None:
    server = ToolServerFactory()
    now = timezone.now()
    due = OperationFactory(server=server, state=State.WORKING, next_poll_at=now - timedelta(seconds=1))
    soon = OperationFactory(server=server, state=State.WORKING,
                            next_poll_at=now + timedelta(seconds=0.5))
    later = OperationFactory(server=server, state=State.WORKING,
                             next_poll_at=now + timedelta(seconds=3))
    # A live holder's lease that runs out within the horizon is still not taken from it.
    held = OperationFactory(server=server, state=State.WORKING, lease_owner="holder",
                            lease_expires_at=now + timedelta(seconds=0.5),
                            next_poll_at=now + timedelta(seconds=0.5))
    sent: list[tuple[list[uuid.UUID], str, dict[uuid.UUID, Any]]] = []
    done = operations_dispatch_due_batches(
        enqueue_batch=lambda ids, owner, early: sent.append((ids, owner, early)),
        batch_size=16, ahead_seconds=1.0)
    assert done.claimed == 2 and len(sent) == 1 and not done.behind
    ids, owner, early = sent[0]
    assert ids == [due.id, soon.id]  # in the order they fall due
    assert early == {soon.id: soon.next_poll_at}  # the row due already is not held
    assert done.next_due_at is not None and done.next_due_at <= later.next_poll_at
    rows = {op.id: op for op in Operation.objects.filter(id__in=[due.id, soon.id, later.id, held.id])}
    assert rows[soon.id].lease_owner == owner and rows[due.id].lease_owner == owner
    assert rows[later.id].lease_owner == "" and rows[held.id].lease_owner == "holder"
    # Without a horizon the same pass takes only what is due.
    Operation.objects.filter(id=soon.id).update(lease_owner="", lease_expires_at=None,
                                                next_poll_at=now + timedelta(seconds=0.5))
    assert operations_dispatch_due_batches(enqueue_batch=lambda *_a: None,
                                           ahead_seconds=0.0).claimed == 0


@pytest.mark.parametrize("behind", ["messages-waiting", "machine-saturated"])
def test_a_fleet_that_is_behind_claims_only_what_is_due(behind: str, cpu_to_spare: list[bool]) -> None:
    server = ToolServerFactory()
    now = timezone.now()
    due = OperationFactory(server=server, state=State.WORKING, next_poll_at=now - timedelta(seconds=1))
    soon = OperationFactory(server=server, state=State.WORKING,
                            next_poll_at=now + timedelta(seconds=0.5))
    room = None
    if behind == "messages-waiting":
        room = 84  # of 100: one batch of 16 rows waits in the broker
    else:
        cpu_to_spare[0] = False
    sent: list[tuple[list[uuid.UUID], dict[uuid.UUID, Any]]] = []
    with override_settings(TOOLOPS_DISPATCH_MAX_QUEUED=100):
        done = operations_dispatch_due_batches(
            enqueue_batch=lambda ids, _owner, early: sent.append((ids, early)), room=room,
            ahead_seconds=1.0)
    # Behind, each row goes with the time it fell due: its worker may put a first poll off.
    assert done.claimed == 1 and done.behind and sent == [([due.id], {due.id: due.next_poll_at})]
    assert Operation.objects.get(id=soon.id).lease_owner == ""


@pytest.mark.usefixtures("cpu_to_spare")
def test_a_row_claimed_ahead_is_polled_at_its_time_not_before(server: ToolServer) -> None:
    op = _submit(server, 0.1)
    time.sleep(0.3)  # done on the server: the first poll settles it
    due_at = timezone.now() + timedelta(seconds=0.8)
    Operation.objects.filter(id=op.id).update(next_poll_at=due_at)
    sent: list[tuple[list[uuid.UUID], str, dict[uuid.UUID, Any]]] = []
    assert operations_dispatch_due_batches(
        enqueue_batch=lambda ids, owner, early: sent.append((ids, owner, early)),
        ahead_seconds=2.0).claimed == 1
    ids, owner, early = sent[0]
    assert early == {op.id: due_at}
    asked: list[tuple[str, float]] = []
    transport = FaultTransport()
    transport.before_reply = lambda method: asked.append((method, time.time()))
    connections_use_transport(lambda _server: transport)
    try:
        # The batch's message returns at once: the row waits in the holder, leased, unpolled.
        assert operations_poll_batch(operation_ids=ids, lease_owner=owner,
                                     not_before=early) == {"ahead": 1}
        waiting = Operation.objects.get(id=op.id)
        assert waiting.lease_owner == owner and waiting.polls_count == op.polls_count
        assert _wait_for(lambda: TerminalReceipt.objects.filter(operation_id=op.id).exists())
    finally:
        connections_use_transport(None)
    first_get = min(at for method, at in asked if method == "tasks/get")
    assert first_get >= due_at.timestamp()
    done = Operation.objects.get(id=op.id)
    assert done.state == State.ACCEPTED and done.lease_owner == ""


@pytest.mark.usefixtures("cpu_to_spare")
def test_a_row_claimed_ahead_and_due_already_is_polled_with_its_batch(server: ToolServer) -> None:
    op = _submit(server, 0.1)
    time.sleep(0.3)
    ids = _claim_now(op, owner="batch-ahead-late")
    # The message came late (a queue behind): its row's time has passed, so no hold.
    late = {op.id: timezone.now() - timedelta(seconds=0.2)}
    assert operations_poll_batch(operation_ids=ids, lease_owner="batch-ahead-late",
                                 not_before=late) == {"accepted": 1}


def test_on_a_busy_machine_a_first_poll_waits_one_more_interval(
        server: ToolServer, cpu_to_spare: list[bool]) -> None:
    cpu_to_spare[0] = False
    op = _submit(server, 0.1)
    time.sleep(0.3)  # done on the server: the one poll it gets settles it
    ids = _claim_now(op, owner="batch-busy")
    Operation.objects.filter(id=op.id).update(poll_interval_ms=700)
    due_at = timezone.now() - timedelta(seconds=0.1)
    asked: list[tuple[str, float]] = []
    transport = FaultTransport()
    transport.before_reply = lambda method: asked.append((method, time.time()))
    connections_use_transport(lambda _server: transport)
    try:
        # Due already, but its first poll: it waits in the holder, leased and unpolled.
        assert operations_poll_batch(operation_ids=ids, lease_owner="batch-busy",
                                     not_before={op.id: due_at}) == {"deferred": 1}
        waiting = Operation.objects.get(id=op.id)
        assert waiting.lease_owner == "batch-busy" and waiting.state == State.WORKING
        assert _wait_for(lambda: TerminalReceipt.objects.filter(operation_id=op.id).exists())
    finally:
        connections_use_transport(None)
    gets = [at for method, at in asked if method == "tasks/get"]
    assert len(gets) == 1 and gets[0] >= due_at.timestamp() + 0.7
    assert Operation.objects.get(id=op.id).state == State.ACCEPTED


@pytest.mark.parametrize("case", ["cpu-to-spare", "answered-working-before", "setting-off",
                                  "interval-past-half-a-lease"])
def test_a_poll_that_is_not_a_first_one_on_a_busy_machine_comes_at_its_time(
        server: ToolServer, cpu_to_spare: list[bool], case: str) -> None:
    cpu_to_spare[0] = case == "cpu-to-spare"
    op = _submit(server, 0.1)
    time.sleep(0.3)
    ids = _claim_now(op, owner="batch-busy-not-first")
    interval = 60_000 if case == "interval-past-half-a-lease" else 700
    Operation.objects.filter(id=op.id).update(
        poll_interval_ms=interval, polls_count=1 if case == "answered-working-before" else 0)
    with override_settings(TOOLOPS_POLL_DEFER_FIRST_WHEN_BUSY=case != "setting-off",
                           TOOLOPS_LEASE_SECONDS=30.0):
        assert operations_poll_batch(
            operation_ids=ids, lease_owner="batch-busy-not-first",
            not_before={op.id: timezone.now() - timedelta(seconds=0.1)}) == {"accepted": 1}


@pytest.mark.usefixtures("cpu_to_spare")
def test_stopping_hands_back_a_row_claimed_ahead_due_now(server: ToolServer) -> None:
    op = _submit(server, 5.0)
    due_at = timezone.now() + timedelta(seconds=2)
    Operation.objects.filter(id=op.id).update(next_poll_at=due_at)
    sent: list[tuple[list[uuid.UUID], str, dict[uuid.UUID, Any]]] = []
    operations_dispatch_due_batches(
        enqueue_batch=lambda ids, owner, early: sent.append((ids, owner, early)),
        ahead_seconds=2.4)
    ids, owner, early = sent[0]
    assert operations_poll_batch(operation_ids=ids, lease_owner=owner,
                                 not_before=early) == {"ahead": 1}
    # The claim moved its next poll time to the lease's end; handed back, it is due at once.
    assert poll_threads_stop() == 1
    row = Operation.objects.get(id=op.id)
    assert row.lease_owner == "" and row.lease_expires_at is None
    assert row.next_poll_at is not None and row.next_poll_at <= timezone.now()
    assert row.polls_count == op.polls_count


def test_claimed_rows_go_out_in_batches_of_the_configured_size() -> None:
    server = ToolServerFactory()
    now = timezone.now() - timedelta(seconds=1)
    rows = OperationFactory.build_batch(10, server=server, state=State.WORKING, next_poll_at=now)
    Operation.objects.bulk_create(rows)
    sent: list[list[uuid.UUID]] = []
    done = operations_dispatch_due_batches(enqueue_batch=lambda ids, _o, _e: sent.append(ids),
                                           batch_size=4, room=9)
    assert done.claimed == 9 and done.read_next_due
    assert done.next_due_at == now  # the tenth row, still due, read in the claim's transaction
    assert [len(b) for b in sent] == [4, 4, 1]


def test_the_poll_task_takes_ids_only_and_its_rows_reach_their_receipts(server: ToolServer) -> None:
    from toolops.tasks import poll_batch

    ops = [_submit(server, 0.6) for _ in range(3)]
    ids = _claim_now(*ops, owner="batch-g")
    # The task body, run inline: working at the first poll, all three held.
    assert poll_batch([str(i) for i in ids], "batch-g") == {"held": 3}
    # Polled again by the holder, to the receipt.
    assert _wait_for(lambda: TerminalReceipt.objects.filter(operation_id__in=ids).count() == 3)
    assert set(Operation.objects.filter(id__in=ids).values_list("state", flat=True)) == {
        State.ACCEPTED}



def test_the_poll_task_holds_rows_claimed_ahead_and_polls_a_time_it_cannot_read_now(
        server: ToolServer) -> None:
    from toolops.tasks import poll_batch

    ahead, unreadable = _submit(server, 0.1), _submit(server, 0.1)
    time.sleep(0.3)
    ids = _claim_now(ahead, unreadable, owner="batch-g2")
    soon = timezone.now() + timedelta(seconds=0.6)
    # The message's times are ISO strings; one that does not parse counts as due now.
    counts = poll_batch([str(i) for i in ids], "batch-g2",
                        {str(ahead.id): soon.isoformat(), str(unreadable.id): "not a time"})
    assert counts == {"accepted": 1, "ahead": 1}
    assert TerminalReceipt.objects.filter(operation_id=unreadable.id).exists()
    assert not TerminalReceipt.objects.filter(operation_id=ahead.id).exists()
    assert _wait_for(lambda: TerminalReceipt.objects.filter(operation_id=ahead.id).exists())


def _counting_row_reads(monkeypatch: pytest.MonkeyPatch) -> list[uuid.UUID]:
    """Count the polls that read their own row (observe.operation_load), on any thread."""
    reads: list[uuid.UUID] = []
    real = observe.operation_load

    def load(*, operation_id: uuid.UUID) -> Operation | None:
        reads.append(operation_id)
        return real(operation_id=operation_id)

    monkeypatch.setattr(observe, "operation_load", load)
    return reads


def test_a_batch_reads_its_rows_in_one_statement_not_one_per_poll(
        server: ToolServer, monkeypatch: pytest.MonkeyPatch) -> None:
    ops = [_submit(server, 0.2) for _ in range(4)]
    time.sleep(0.4)
    reads = _counting_row_reads(monkeypatch)
    ids = _claim_now(*ops, owner="batch-h")
    with CaptureQueriesContext(connection) as queries:
        counts = operations_poll_batch(operation_ids=ids, lease_owner="batch-h")
    assert counts == {"accepted": 4}
    assert reads == []  # no poll read its row again
    # This thread sent the batch's one read; the polls ran on the poll threads.
    assert [q["sql"] for q in queries.captured_queries if "= ANY(" in q["sql"]] == [
        q["sql"] for q in queries.captured_queries]
    assert len(queries.captured_queries) == 1
    assert TerminalReceipt.objects.filter(operation_id__in=ids).count() == 4


def test_if_the_batch_read_fails_each_poll_reads_its_own_row(
        server: ToolServer, monkeypatch: pytest.MonkeyPatch) -> None:
    ops = [_submit(server, 0.2) for _ in range(3)]
    time.sleep(0.4)
    reads = _counting_row_reads(monkeypatch)

    def broken(**_kwargs: Any) -> dict[uuid.UUID, Operation]:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr("toolops.services.boundary.operations_load", broken)
    ids = _claim_now(*ops, owner="batch-i")
    assert operations_poll_batch(operation_ids=ids, lease_owner="batch-i") == {"accepted": 3}
    assert sorted(reads) == sorted(ids)


def test_a_row_read_with_its_batch_and_re_claimed_before_its_poll_writes_nothing(
        server: ToolServer) -> None:
    op = _submit(server, 0.2)
    time.sleep(0.4)  # done on the server: a poll would accept it
    _claim_now(op, owner="batch-old")
    stale = operations_load(operation_ids=[op.id])[op.id]
    # Between the batch's read and this row's poll, the lease ran out and another worker
    # claimed the row: the read still says the lease is ours.
    Operation.objects.filter(id=op.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    _claim_now(op, owner="batch-new")
    events = OperationEvent.objects.filter(operation_id=op.id).count()
    outcome = observe.operation_poll(operation_id=op.id, lease_owner="batch-old", loaded=stale)
    assert not outcome.startswith("accepted"), outcome
    row = Operation.objects.get(id=op.id)
    assert row.state == State.WORKING and row.lease_owner == "batch-new"
    assert OperationEvent.objects.filter(operation_id=op.id).count() == events
    assert not TerminalReceipt.objects.filter(operation_id=op.id).exists()
    # The new owner's poll, reading its own row, accepts it once.
    assert observe.operation_poll(operation_id=op.id, lease_owner="batch-new").startswith("accepted")
    assert TerminalReceipt.objects.filter(operation_id=op.id).count() == 1
