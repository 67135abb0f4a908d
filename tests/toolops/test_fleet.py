"""Fleet: real Celery worker and beat subprocesses against PostgreSQL and Redis.

A worker is SIGKILLed in the middle of an operation and a fresh one started: the ledger (leases,
poll schedule in rows) must carry the operation to exactly one receipt, with one task on the server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from django.db import connection

from ledger.models import Operation, OutboxEvent, TerminalReceipt
from ledger.states import State
from tests.peers.launch import peer_stats
from toolops.services.servers import server_add
from toolops.services.submit import operation_submit

REPO = Path(__file__).resolve().parents[2]
BROKER = os.environ.get("TOOLOPS_TEST_BROKER_URL", "redis://127.0.0.1:6379/15")

pytestmark = [pytest.mark.fleet, pytest.mark.django_db(transaction=True)]


def _fleet_env(tmp: Path) -> dict[str, str]:
    db = connection.settings_dict
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": f"postgres://{db['USER'] or 'root'}@{db['HOST'] or '127.0.0.1'}:"
                        f"{db['PORT'] or 5432}/{db['NAME']}",
        "CELERY_BROKER_URL": BROKER,
        # A short lease: the killed worker's claim must expire quickly for the test to be quick.
        "TOOLOPS_LEASE_SECONDS": "3",
        "TOOLOPS_POLL_FLOOR_SECONDS": "0.1",
        "PYTHONUNBUFFERED": "1",
        # The reference server listens on loopback, which the default URL policy refuses.
        "TOOLOPS_SERVER_HOSTS": "public,127.0.0.0/8,::1",
    }


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", *args],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )


def _kill(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=15)


@pytest.fixture
def fleet_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    assert connection.vendor == "postgresql", "the fleet test runs on PostgreSQL"
    redis.Redis.from_url(BROKER).flushdb()  # fails (never skips) when Redis is down
    yield _fleet_env(tmp_path)


def _within(predicate: Callable[[], object], seconds: float, step: float = 0.05) -> bool:
    """Whether `predicate` holds within `seconds` (checked every `step`)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False


def _wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    if not _within(predicate, timeout, step=0.1):
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_worker_killed_mid_operation_loses_and_duplicates_nothing(
    mcp_url: str, fleet_env: dict[str, str], tmp_path: Path
) -> None:
    server = server_add(name="fleet", url=mcp_url)
    t0 = time.monotonic()
    op = operation_submit(server_name="fleet", tool_name="sleep_then_complete",
                          call_node_id="fleet-node", arguments={"seconds": 10, "value": "ok"},
                          ttl_ms=120_000)
    assert op.state == State.WORKING
    worker_args = ["worker", "--concurrency", "1", "--pool", "prefork", "--without-gossip",
                   "--without-mingle", "-l", "info"]
    beat = _start(["beat", "-s", str(tmp_path / "beat-schedule"), "-l", "info"], fleet_env,
                  tmp_path / "beat.log")
    first = _start([*worker_args, "-n", "first@%h"], fleet_env, tmp_path / "worker1.log")
    second = None
    try:
        # Any poll recorded by the first worker (a working poll is counted on the row, not
        # written as an event); the 10 s task is still running then even when a loaded machine
        # starts the worker slowly.
        _wait_for(lambda: Operation.objects.filter(id=op.id, polls_count__gt=0).exists(), 45,
                  "the first worker to poll the operation")
        _kill(first)  # SIGKILL: no shutdown, no acks, leases left behind
        assert not TerminalReceipt.objects.filter(operation=op).exists()
        second = _start([*worker_args, "-n", "second@%h"], fleet_env, tmp_path / "worker2.log")
        _wait_for(lambda: TerminalReceipt.objects.filter(operation=op).exists(), 60,
                  "the second worker to accept the operation")
        elapsed = time.monotonic() - t0
    finally:
        for proc in (first, second, beat):
            if proc is not None:
                _kill(proc, signal.SIGTERM) if proc.poll() is None else None
        for log in sorted(tmp_path.glob("*.log")):
            sys.stderr.write(f"--- {log.name} (tail) ---\n{log.read_text()[-1500:]}\n")

    op.refresh_from_db()
    assert op.state == State.ACCEPTED
    assert TerminalReceipt.objects.filter(call_node_id="fleet-node").count() == 1
    assert OutboxEvent.objects.filter(receipt__operation=op).count() == 1
    assert peer_stats(mcp_url)["submission_keys"][op.submission_key] == 1
    assert server.operations.count() == 1
    print(f"\nfleet: submit -> ACCEPTED in {elapsed:.2f}s with one worker SIGKILLed mid-run")


def test_a_thread_pool_worker_accepts_every_call_and_hands_its_held_rows_back_when_stopped(
    mcp_url: str, fleet_env: dict[str, str], tmp_path: Path
) -> None:
    # `-P threads`: the polls run in the worker's own process, and each late-acked batch ends on
    # a pool thread (toolops/worker_pool.py). Short calls must all settle once; a long one held
    # between its polls must be handed back when the worker stops, not left leased.
    server = server_add(name="fleet-threads", url=mcp_url)
    short = [operation_submit(server_name="fleet-threads", tool_name="sleep_then_complete",
                              call_node_id=f"threads-{k}", arguments={"seconds": 1, "value": f"v{k}"},
                              ttl_ms=120_000) for k in range(6)]
    long = operation_submit(server_name="fleet-threads", tool_name="sleep_then_complete",
                            call_node_id="threads-long", arguments={"seconds": 90, "value": "x"},
                            ttl_ms=300_000)
    beat = _start(["beat", "-s", str(tmp_path / "beat-schedule"), "-l", "info"], fleet_env,
                  tmp_path / "beat.log")
    worker = _start(["worker", "--concurrency", "4", "--pool", "threads", "--without-gossip",
                     "--without-mingle", "-l", "info", "-n", "threads@%h"], fleet_env,
                    tmp_path / "worker.log")
    try:
        _wait_for(lambda: TerminalReceipt.objects.filter(
            operation__in=[op.id for op in short]).count() == len(short), 60,
            "the thread-pool worker to accept the short calls")
        _wait_for(lambda: Operation.objects.filter(id=long.id, polls_count__gte=3)
                  .exclude(lease_owner="").exists(), 45, "the long call to be held between polls")
        os.killpg(worker.pid, signal.SIGTERM)  # warm shutdown
        worker.wait(timeout=30)
    finally:
        for proc in (worker, beat):
            if proc.poll() is None:
                _kill(proc, signal.SIGTERM)
        for log in sorted(tmp_path.glob("*.log")):
            sys.stderr.write(f"--- {log.name} (tail) ---\n{log.read_text()[-1500:]}\n")

    sent = peer_stats(mcp_url)["submission_keys"]
    for k, op in enumerate(short):
        op.refresh_from_db()
        assert op.state == State.ACCEPTED and op.terminal_status == "completed"
        assert op.result is not None and f"v{k}" in json.dumps(op.result)
        assert TerminalReceipt.objects.filter(operation=op).count() == 1
        assert OutboxEvent.objects.filter(receipt__operation=op).count() == 1
        assert sent[op.submission_key] == 1
    long.refresh_from_db()
    assert long.state == State.WORKING and not TerminalReceipt.objects.filter(operation=long).exists()
    assert long.lease_owner == "" and long.lease_expires_at is None, \
        "the stopped worker left its held row leased"
    assert server.operations.count() == len(short) + 1
    assert "Traceback" not in (tmp_path / "worker.log").read_text()
