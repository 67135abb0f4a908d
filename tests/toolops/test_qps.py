"""The per-server QPS cap: the Redis bucket (one Lua script) under 4 concurrent worker processes,
the in-process bucket under 4 threads, and the executor's reaction to a refused token (the call
is re-scheduled, nothing is sent)."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import uuid

import pytest
from django.utils import timezone

from ledger.models import Operation, OperationEvent, ToolServer
from ledger.states import State
from tests.peers.fault_transport import FaultTransport
from toolops.qps import LocalTokenBucket, TokenBucket, qps_bucket, server_bucket_key
from toolops.qps_redis import RedisTokenBucket
from toolops.services.connections import server_token_take
from toolops.services.dispatch import operations_claim_due
from toolops.services.observe import operation_poll
from toolops.services.servers import server_add
from toolops.services.submit import operation_submit

BROKER = os.environ.get("TOOLOPS_TEST_BROKER_URL", "redis://127.0.0.1:6379/15")
RATE = 20.0
RUN_SECONDS = 3.0
WORKERS = 4


def _hammer(bucket: TokenBucket, key: str, until: float) -> tuple[int, int]:
    """A worker's loop: take; when refused, wait the time the bucket named (no spinning)."""
    granted = refused = 0
    while time.time() < until:
        take = bucket.take(key=key, rate=RATE, purpose="poll")
        if take.granted:
            granted += 1
        else:
            refused += 1
            time.sleep(take.wait_s)
    return granted, refused


def _redis_worker(url: str, key: str, until: float, out: multiprocessing.Queue) -> None:
    out.put(_hammer(RedisTokenBucket(url=url), key, until))


def _assert_cap_held(*, bucket: TokenBucket, key: str, granted: int, started: float,
                     ended: float) -> None:
    stats = bucket.stats(key=key)
    assert stats.total == granted
    # The hard cap, counted atomically where the tokens are taken: no second saw more than RATE.
    assert stats.peak_in_one_second <= RATE
    # Over the whole run: at most one full bucket (capacity 1) plus the refill.
    assert granted <= RATE * (ended - started) + 1
    # ... and the workers really got the rate (the cap is not met by refusing everybody).
    assert granted >= 0.8 * RATE * RUN_SECONDS
    assert stats.denied > 0 and stats.by_purpose == {"poll": granted}


def test_redis_bucket_holds_under_four_concurrent_worker_processes() -> None:
    key = f"test:{uuid.uuid4().hex}"
    bucket = RedisTokenBucket(url=BROKER)
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()
    started = time.time()
    until = started + RUN_SECONDS
    procs = [ctx.Process(target=_redis_worker, args=(BROKER, key, until, out)) for _ in range(WORKERS)]
    for p in procs:
        p.start()
    results = [out.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    ended = time.time()
    assert all(g > 0 for g, _ in results), "every worker got tokens"
    _assert_cap_held(bucket=bucket, key=key, granted=sum(g for g, _ in results),
                     started=started, ended=ended)
    bucket.reset(key=key)
    assert bucket.stats(key=key).total == 0


def test_local_bucket_holds_under_four_threads() -> None:
    bucket = LocalTokenBucket()
    results: list[tuple[int, int]] = []
    started = time.time()
    until = started + RUN_SECONDS

    def worker() -> None:
        results.append(_hammer(bucket, "k", until))

    threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _assert_cap_held(bucket=bucket, key="k", granted=sum(g for g, _ in results),
                     started=started, ended=time.time())


def test_a_refusal_names_when_the_next_token_comes() -> None:
    bucket = LocalTokenBucket()
    assert bucket.take(key="k", rate=2.0, purpose="submit").granted
    refused = bucket.take(key="k", rate=2.0, purpose="submit")
    assert not refused.granted and 0.0 < refused.wait_s <= 0.5
    time.sleep(refused.wait_s + 0.01)
    assert bucket.take(key="k", rate=2.0, purpose="cancel").granted
    assert bucket.stats(key="k").by_purpose == {"submit": 1, "cancel": 1}


# -- the executor under a refused token ---------------------------------------------------------

@pytest.fixture
def slow_server(mcp_url: str, faults: FaultTransport) -> ToolServer:
    srv = server_add(name=f"slow-{uuid.uuid4().hex[:6]}", url=mcp_url, max_qps=0.5)
    qps_bucket().reset(key=server_bucket_key(server_id=srv.pk))
    return srv


def _drain(server: ToolServer) -> None:
    """Start from a full bucket and use its one token, so the next call is the first refused."""
    server.refresh_from_db()
    qps_bucket().reset(key=server_bucket_key(server_id=server.pk))
    server_token_take(server=server, purpose="lookup")


@pytest.mark.django_db
def test_a_poll_without_a_token_is_rescheduled_not_sent(
    slow_server: ToolServer, faults: FaultTransport
) -> None:
    ToolServer.objects.filter(pk=slow_server.pk).update(max_qps=100.0)
    op = operation_submit(server_name=slow_server.name, tool_name="sleep_then_complete",
                          call_node_id="n-qps", arguments={"seconds": 30, "value": "v"}, ttl_ms=60_000)
    assert op.state == State.WORKING
    ToolServer.objects.filter(pk=slow_server.pk).update(max_qps=0.5)
    _drain(slow_server)
    Operation.objects.filter(id=op.id).update(next_poll_at=timezone.now())
    assert operations_claim_due(owner="w1") == [op.id]
    events_before = OperationEvent.objects.filter(operation=op).count()
    sent_before = list(faults.methods)
    before = timezone.now()
    assert operation_poll(operation_id=op.id, lease_owner="w1") == "rate_limited"
    op.refresh_from_db()
    assert faults.methods == sent_before, "nothing was sent without a token"
    assert op.state == State.WORKING and op.lease_owner == "" and op.lease_expires_at is None
    # Re-scheduled for when the bucket has a token (2 s at 0.5 QPS), spread by jitter: not spun.
    delay = (op.next_poll_at - before).total_seconds()  # type: ignore[operator]
    assert 0.5 < delay <= 2.0 + 2.0 + 0.5
    assert OperationEvent.objects.filter(operation=op).count() == events_before
    assert operations_claim_due(owner="w2") == []


@pytest.mark.django_db
def test_a_submit_without_a_token_sends_nothing_and_is_proven_safe(
    slow_server: ToolServer, faults: FaultTransport, settings
) -> None:
    settings.TOOLOPS_SUBMIT_MAX_TOKEN_WAIT_SECONDS = 0.0
    _drain(slow_server)
    op = operation_submit(server_name=slow_server.name, tool_name="sleep_then_complete",
                          call_node_id="n-qps-submit", arguments={"seconds": 1, "value": "v"}, ttl_ms=60_000)
    assert "tools/call" not in faults.methods
    assert op.state == State.NOT_FOUND_SAFE
    event = OperationEvent.objects.get(operation=op, kind="submit_refused_by_server")
    assert event.data["detail"] == {"rate_limited": True}


@pytest.mark.django_db
def test_polls_report_counts_what_was_sent_against_the_cap(
    slow_server: ToolServer, faults: FaultTransport
) -> None:
    import json
    from io import StringIO

    from django.core.management import call_command

    from toolops.runner import run_embedded

    ToolServer.objects.filter(pk=slow_server.pk).update(max_qps=4.0)
    op = operation_submit(server_name=slow_server.name, tool_name="sleep_then_complete",
                          call_node_id="n-report", arguments={"seconds": 1.0, "value": "v"},
                          ttl_ms=60_000)
    run_embedded(until_idle=True, max_seconds=20)
    assert Operation.objects.get(id=op.id).state == State.ACCEPTED
    out = StringIO()
    call_command("toolops", "polls", "--json", "--server", slow_server.name, stdout=out)
    (row,) = json.loads(out.getvalue())["servers"]
    sent = {m: faults.methods.count(m) for m in ("tools/call", "tasks/get", "tasks/result")}
    assert row["requests_by_purpose"] == {"submit": sent["tools/call"], "poll": sent["tasks/get"],
                                          "result": sent["tasks/result"]}
    assert row["total_requests"] == sum(sent.values())
    assert row["configured_qps"] == 4.0 and 1 <= row["peak_requests_in_one_second"] <= 4
    assert row["operations"] == 1 and row["polls_per_operation"] == sent["tasks/get"]
