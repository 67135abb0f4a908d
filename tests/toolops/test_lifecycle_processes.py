"""Input rounds as a fleet runs them: every step in its own OS process.

Submit is a `manage.py toolops submit` process, polls are a real Celery worker driven by Celery
beat, each answer is its own `manage.py toolops answer` process; the test process only reads the
ledger. Two- and three-round questions against the Shape A reference server (official `mcp`
SDK) and the Shape B one (FastMCP + fastmcp-tasks) must end ACCEPTED with every answer in the
result. The worker is replaced by a new process after each round opens (as deploys do). Before
input streams were released with `notifications/cancelled`, round 2 never opened here: the
server kept serving the old worker's tasks/result request and sent round 2 into it.
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
from typing import Any

import pytest
import redis
from django.db import connection

from ledger.models import InputRequest, Operation, TerminalReceipt
from ledger.states import State

REPO = Path(__file__).resolve().parents[2]
BROKER = os.environ.get("TOOLOPS_TEST_BROKER_URL", "redis://127.0.0.1:6379/15")

pytestmark = [pytest.mark.fleet, pytest.mark.django_db(transaction=True)]


def _env() -> dict[str, str]:
    db = connection.settings_dict
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": f"postgres://{db['USER'] or 'root'}@{db['HOST'] or '127.0.0.1'}:"
                        f"{db['PORT'] or 5432}/{db['NAME']}",
        "CELERY_BROKER_URL": BROKER,
        "TOOLOPS_POLL_FLOOR_SECONDS": "0.1",
        # The reference servers listen on loopback, which the default URL policy refuses.
        "TOOLOPS_SERVER_HOSTS": "public,127.0.0.0/8,::1",
        "PYTHONUNBUFFERED": "1",
    }


def _manage(env: dict[str, str], *args: str) -> dict[str, Any]:
    """One `manage.py toolops ...` process; its JSON output."""
    done = subprocess.run([sys.executable, "manage.py", "toolops", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"toolops {args[0]} failed: {done.stderr[-2000:]}"
    return dict(json.loads(done.stdout))


def _celery(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "celery", "-A", "config", *args], cwd=REPO,
                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Fleet:
    """Celery beat + one worker, each its own process. A fleet's workers come and go (deploys,
    autoscaling): `worker_replace` stops the worker and starts a new one, so the poll after an
    answer runs in a process that did not read the round before."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.env = _env()
        self.generation = 0
        self.beat = _celery(["beat", "-s", str(tmp / "beat-schedule"), "-l", "info"], self.env,
                            tmp / "beat.log")
        self.worker = self._worker()

    def _worker(self) -> subprocess.Popen[bytes]:
        self.generation += 1
        return _celery(["worker", "--concurrency", "1", "--pool", "prefork", "--without-gossip",
                        "--without-mingle", "-l", "info", "-n", f"rounds{self.generation}@%h"],
                       self.env, self.tmp / f"worker{self.generation}.log")

    def worker_replace(self) -> None:
        _stop(self.worker)
        self.worker = self._worker()

    def stop(self) -> None:
        for proc in (self.worker, self.beat):
            _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    assert connection.vendor == "postgresql", "the fleet runs on PostgreSQL"
    redis.Redis.from_url(BROKER).flushdb()  # fails (never skips) when Redis is down
    running = Fleet(tmp_path)
    try:
        yield running
    finally:
        running.stop()
        for log in sorted(tmp_path.glob("*.log")):
            sys.stderr.write(f"--- {log.name} (tail) ---\n{log.read_text()[-1500:]}\n")


def _run_rounds(fleet: Fleet, *, server: str, url: str, adapter: str, tool: str,
                rounds: int) -> Operation:
    env = fleet.env
    _manage(env, "server-add", server, "--url", url, "--adapter", adapter, "--max-qps", "20")
    submitted = _manage(env, "submit", "--server", server, "--tool", tool, "--call-node",
                        f"{server}/ask", "--args", json.dumps({"question": "q", "rounds": rounds}),
                        "--ttl-ms", "300000")
    op_id = submitted["operation_id"]
    for n in range(1, rounds + 1):
        _wait_for(lambda n=n: InputRequest.objects.filter(  # type: ignore[misc]
            operation_id=op_id, round=n, status=InputRequest.Status.OPEN).exists(),
            90, f"input round {n} to open")
        digest = InputRequest.objects.get(operation_id=op_id, round=n).schema_digest
        fleet.worker_replace()  # the next poll is another process's
        answered = _manage(env, "answer", op_id, "--round", str(n), "--json",
                           json.dumps({"value": f"answer-{n}"}), "--schema-digest", digest)
        assert answered["input_requests"][n - 1]["status"] == "answered"
    _wait_for(lambda: TerminalReceipt.objects.filter(operation_id=op_id).exists(), 90,
              "the receipt")
    return Operation.objects.get(id=op_id)


def _check(op: Operation, rounds: int) -> None:
    assert op.state == State.ACCEPTED and op.terminal_status == "completed"
    assert op.input_requests.count() == rounds
    assert op.input_requests.filter(status=InputRequest.Status.ANSWERED).count() == rounds
    text = json.dumps(op.result)
    for n in range(1, rounds + 1):
        assert f"answer-{n}" in text, f"answer {n} missing from the result: {text[:500]}"


@pytest.mark.parametrize("rounds", [2, 3])
def test_shape_a_rounds_across_processes(mcp_url: str, fleet: Fleet, rounds: int) -> None:
    op = _run_rounds(fleet, server=f"a{rounds}", url=mcp_url, adapter="mcp-tasks/2025-11-25",
                     tool="ask_input", rounds=rounds)
    _check(op, rounds)


@pytest.mark.parametrize("rounds", [2, 3])
def test_shape_b_rounds_across_processes(ext_url: str, fleet: Fleet, rounds: int) -> None:
    op = _run_rounds(fleet, server=f"b{rounds}", url=ext_url, adapter="mcp-tasks-ext/2026-07-28",
                     tool="ask_rounds", rounds=rounds)
    _check(op, rounds)
