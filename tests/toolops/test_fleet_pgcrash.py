"""Fleet: PostgreSQL itself crashes mid-run and restarts (WAL replay), on a private cluster.

The shared server is never touched: this test makes its own cluster with the machine's
PostgreSQL binaries (initdb into a temporary directory, its own port), migrates it, and runs a
real `celery -A config beat` and worker and a submitting process against it, with the reference
MCP server. Once every call is submitted and the fleet is polling, the cluster is stopped in
`immediate` mode (every backend and the WAL writer exit at once; what the WAL writer had not yet
written is gone, as in a crash) and started again, which replays its WAL.

The commits that did not wait for their flush (a working poll's schedule and counters, a held
lease's renewal, a claim: ledger/flush.py) may be lost there. What must hold anyway: every call
ends accepted with exactly one receipt and one outbox row, the server saw exactly one
`tools/call` per call, and the gate passes with no stranded row.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from tests.peers.launch import _free_port, peer_stats
from tests.toolops.test_fleet import BROKER, REPO, _fleet_env, _kill, _start, _wait_for, _within

pytestmark = [pytest.mark.fleet, pytest.mark.django_db(transaction=True)]

CALLS = 20
# A crash may lose no write that did not wait for its flush (see _crash_mid_poll); each
# attempt (a round of polls, the crash, two seconds down, the restart) takes four to five seconds,
# and the calls run 16 s or more, so the last attempt still finds them polling.
CRASH_ATTEMPTS = 3
SERVER = "pgcrash"
DB = "toolops_pgcrash"
# Each of the three writes that do not wait for their flush counts here: a working poll adds to
# polls_count, and a claim or a held lease's renewal to poll_attempts.
COUNTED = "SELECT coalesce(sum(polls_count + poll_attempts), 0) FROM ledger_operation"
SUBMITTER = """
import json
from toolops.services.submit import operation_submit
for i in range({calls}):
    key = "pgcrash-{run}-%d" % i
    op = operation_submit(server_name="{server}", tool_name="sleep_then_complete",
                          call_node_id=key, submission_key=key, ttl_ms=300_000,
                          arguments={{"seconds": 16.0 + (i % 4) * 0.5, "value": key}})
    print(json.dumps({{"key": key, "state": op.state, "remote_id": op.remote_id}}), flush=True)
"""


def _pg_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parent.parent.name))
    if not found:
        on_path = shutil.which("initdb")
        assert on_path, "PostgreSQL's server binaries (initdb, pg_ctl) are not installed"
        return Path(on_path).parent
    return found[-1].parent


class Cluster:
    """A throwaway PostgreSQL cluster: trust auth, superuser `root`, one port, TCP only."""

    def __init__(self) -> None:
        self.bin = _pg_bin()
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="toolops-pgcrash-"))
        self.data = self.dir / "data"
        # PostgreSQL refuses to run as root: as root, the cluster belongs to `postgres`.
        self.owner = "postgres" if os.geteuid() == 0 else None
        if self.owner:
            entry = pwd.getpwnam(self.owner)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "root", "--auth=trust", "-E", "UTF8")

    def _command(self, tool: str, *args: str) -> list[str]:
        cmd = [str(self.bin / tool), *args]
        return ["runuser", "-u", self.owner, "--", *cmd] if self.owner else cmd

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run(self._command(tool, *args), capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode == 0, f"{tool} failed:\n{done.stdout}\n{done.stderr}"

    def start(self) -> None:
        options = (f"-c port={self.port} -c listen_addresses=127.0.0.1 "
                   f"-c unix_socket_directories={self.dir} -c max_connections=60 "
                   # The WAL writer at its slowest: the commits that do not wait for their flush
                   # stay unwritten until a commit that waits (or a full WAL page) writes them,
                   # so the crash below takes some of them with it.
                   "-c wal_writer_delay=10000ms")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "server.log"), "-o", options,
                  "-w", "-t", "60", "start")

    def crash(self) -> None:
        # Immediate mode: the postmaster tells every child to quit at once, with no checkpoint
        # and no last write of the WAL buffers; the next start replays the WAL as after a crash.
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def url(self, db: str) -> str:
        return f"postgres://root@127.0.0.1:{self.port}/{db}"

    def query(self, sql: str) -> list[tuple[object, ...]]:
        with psycopg.connect(self.url(DB), autocommit=True, connect_timeout=5) as conn:
            return list(conn.execute(sql).fetchall())

    def remove(self) -> None:
        # Not checked: the cluster may already be down (a failed start, a crash not restarted).
        subprocess.run(self._command("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop"),
                       capture_output=True, timeout=60, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    made = Cluster()
    try:
        made.start()
        with psycopg.connect(made.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DB}")
        yield made
    finally:
        made.remove()


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _signal_all(procs: list[subprocess.Popen[bytes]], sig: int) -> None:
    for proc in procs:
        os.killpg(proc.pid, sig)


def _settled(cluster: Cluster, keys: list[str]) -> bool:
    try:
        rows = cluster.query("SELECT submission_key, state FROM ledger_operation")
    except psycopg.OperationalError:
        return False
    states = {str(key): str(state) for key, state in rows}
    return all(states.get(k) in ("ACCEPTED", "RECONCILIATION_REQUIRED") for k in keys)


def _crash_mid_poll(cluster: Cluster, procs: list[subprocess.Popen[bytes]]) -> int:
    """Crash the database at a moment when the WAL holds records not yet flushed and start it
    again; return how many counted writes (COUNTED) it did not keep.

    The WAL past the flush point may hold no lost commit at all: a read that prunes a page
    writes WAL too, and a commit that waits (an acceptance, a submit) flushes every commit
    before it. So a crash may lose nothing, and the caller crashes again."""
    start = int(cluster.query(COUNTED)[0][0])
    # Let the fleet poll (working answers: the writes that do not wait for their flush).
    _wait_for(lambda: int(cluster.query(COUNTED)[0][0]) >= start + CALLS, 60, "a round of working polls")
    # The fleet is frozen while it is read and the database crashes, so nothing commits in
    # between; it is frozen at a moment when the WAL holds records not yet flushed (the WAL
    # writer, at its slowest here, flushes only full pages until its timer comes).
    unflushed = "SELECT pg_current_wal_insert_lsn() - pg_current_wal_flush_lsn()"
    # A statement sent before the freeze still runs to its commit on the server.
    busy = ("SELECT count(*) FROM pg_stat_activity WHERE state <> 'idle' "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()")
    for _ in range(100):
        _signal_all(procs, signal.SIGSTOP)
        # A process frozen between two statements of one transaction (a claim's) leaves its
        # backend "idle in transaction" for as long as it is frozen: that moment is no good,
        # and the next one is tried.
        if (_within(lambda: int(cluster.query(busy)[0][0]) == 0, 2.0)
                and int(cluster.query(unflushed)[0][0]) > 0):
            break
        _signal_all(procs, signal.SIGCONT)
        time.sleep(0.05)
    seen = int(cluster.query(COUNTED)[0][0])
    cluster.crash()
    _signal_all(procs, signal.SIGCONT)
    time.sleep(2.0)  # the fleet meets a database that is gone
    # Frozen again while the database comes back and what it kept is read, so the fleet's
    # first writes after the restart are not counted as kept.
    _signal_all(procs, signal.SIGSTOP)
    cluster.start()
    lost = seen - int(cluster.query(COUNTED)[0][0])
    _signal_all(procs, signal.SIGCONT)
    return lost


# The crash drops every connection of the worker's pool: the children's on prefork, the pool's
# and poll threads' of the one process on threads.
@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_database_crash_loses_no_call_and_duplicates_nothing(
    mcp_url: str, cluster: Cluster, tmp_path: Path, pool: str
) -> None:
    redis.Redis.from_url(BROKER).flushdb()
    env = {**_fleet_env(tmp_path), "DATABASE_URL": cluster.url(DB)}
    _manage(env, "migrate", "-v0")
    _manage(env, "toolops", "server-add", SERVER, "--url", mcp_url, "--max-qps", "1000")
    run = str(int(time.time()))
    keys = [f"pgcrash-{run}-{i}" for i in range(CALLS)]
    before = peer_stats(mcp_url)

    worker = ["worker", "--concurrency", "2", "--pool", pool, "--without-gossip",
              "--without-mingle", "-l", "info", "-n", "pgcrash@%h"]
    procs = [_start(["beat", "-s", str(tmp_path / "beat-schedule"), "-l", "info"], env,
                    tmp_path / "beat.log"),
             _start(worker, env, tmp_path / "worker.log")]
    attempts: list[int] = []
    try:
        submitted = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c",
             SUBMITTER.format(calls=CALLS, run=run, server=SERVER)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False)
        assert submitted.returncode == 0, submitted.stderr[-3000:]
        lines = [json.loads(line) for line in submitted.stdout.splitlines() if line.startswith("{")]
        assert [line["key"] for line in lines] == keys
        assert all(line["state"] == "WORKING" for line in lines), lines

        for _attempt in range(CRASH_ATTEMPTS):
            attempts.append(_crash_mid_poll(cluster, procs))
            if attempts[-1] > 0:
                break
        _wait_for(lambda: _settled(cluster, keys), 180, "every call to settle after the crash")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGCONT)  # a frozen process cannot stop
                _kill(proc, signal.SIGTERM)
        for log in sorted(tmp_path.glob("*.log")):
            sys.stderr.write(f"--- {log.name} (tail) ---\n{log.read_text()[-2000:]}\n")
    sys.stderr.write(f"polls and claims recorded before a crash and not after it: {attempts}\n")
    # The crash took committed writes with it (those that did not wait for their flush): this
    # is the case the test is about, not a crash after which nothing was missing.
    lost_polls = attempts[-1] if attempts else None
    assert lost_polls is not None and lost_polls > 0, lost_polls

    states = dict(cluster.query("SELECT submission_key, state FROM ledger_operation"))
    assert all(states[k] == "ACCEPTED" for k in keys), states
    receipts = dict(cluster.query(
        "SELECT call_node_id, count(*) FROM ledger_terminalreceipt GROUP BY call_node_id"))
    assert receipts == {k: 1 for k in keys}
    outbox = cluster.query("SELECT count(*), count(DISTINCT receipt_id) FROM ledger_outboxevent")[0]
    assert outbox == (CALLS, CALLS)
    stats = peer_stats(mcp_url)
    assert {k: stats["submission_keys"].get(k, 0) for k in keys} == {k: 1 for k in keys}
    assert (stats["tool_calls"].get("sleep_then_complete", 0)
            - before["tool_calls"].get("sleep_then_complete", 0)) == CALLS
    gate = subprocess.run([sys.executable, "manage.py", "toolops", "gate", "--json", "--server", SERVER],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert gate.returncode == 0, gate.stdout[-3000:] + gate.stderr[-2000:]
    report = json.loads(gate.stdout)
    assert report["passed"], report
