"""Fleet: the database is cut away mid-run, at chosen points of the cycle, through a TCP proxy.

Real `celery -A config beat` and two `celery -A config worker` processes, and a submitting
process, all reach PostgreSQL through tests/peers/pg_proxy.py; the test itself uses the direct
connection for its assertions, and the shared server is never restarted. Cuts are aimed by the
proxy at the statement that writes each point of the cycle (the proxy sees the SQL text the
driver sends): it drops every connection instead of forwarding that statement and refuses new
ones for a few seconds. Aimed: the write of a `tools/call` reply (a short cut the retry rides
out, and one longer than the retries), the result store, the receipt insert of acceptance; plus
one blind cut in the middle of the run.

Every call must end with one receipt and exactly one `tools/call` on the reference server, or be
in the reconciliation queue with its remote id in the evidence; the caller of a submit whose
reply was not recorded gets a typed one-line error; and the gate passes, stranded rows included.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from django.db import connection

from ledger.models import Operation, ReconciliationItem, TerminalReceipt, ToolServer
from ledger.states import State
from tests.peers.launch import peer_stats
from tests.peers.pg_proxy import PgProxy
from tests.toolops.test_fleet import BROKER, REPO, _fleet_env, _kill, _start, _wait_for
from toolops.services.gate import gate_report
from toolops.services.servers import server_add

pytestmark = [pytest.mark.fleet, pytest.mark.django_db(transaction=True)]

CALLS = 16
SERVER = "dbcut"
# What the submitting process runs (manage.py shell -c): one JSON line per call.
SUBMITTER = """
import faulthandler, json, signal, sys, time
from django.db import close_old_connections
from toolops.errors import SubmissionKeyTaken
from toolops.services.submit import operation_submit
faulthandler.register(signal.SIGUSR1)  # the test asks for the stacks before it stops us
for i in range({calls}):
    key = "dbcut-{run}-%d" % i
    # A client that retries with the same key while the database refuses it (safe: the key is
    # unique, so a row written by an earlier try makes the retry fail as a taken key).
    for attempt in range(20):
        try:
            op = operation_submit(server_name="{server}", tool_name="sleep_then_complete",
                                  call_node_id=key, submission_key=key, ttl_ms=120_000,
                                  arguments={{"seconds": 0.3 + (i % 5) * 0.3, "value": key}})
            line = {{"key": key, "ok": True, "state": op.state, "remote_id": op.remote_id}}
        except SubmissionKeyTaken:
            break  # an earlier try wrote the row: its outcome stands
        except Exception as exc:
            line = {{"key": key, "ok": False,
                     "type": type(exc).__module__ + "." + type(exc).__name__,
                     "message": str(exc).splitlines()[0] if str(exc) else ""}}
            # Nothing was sent (the row could not be written): retry with the same key, as the
            # error says. A reply that could not be recorded is not retried: its key is taken.
            if line["type"] == "toolops.errors.LedgerUnavailable" or line["type"].startswith("django.db"):
                close_old_connections()
                time.sleep(0.5)
                continue
        break
    line["attempts"] = attempt + 1
    print(json.dumps(line), flush=True)
    time.sleep(0.6)
"""
SETTLED = (State.ACCEPTED, State.RECONCILIATION_REQUIRED, State.NOT_FOUND_SAFE)


@pytest.fixture
def cut_env(tmp_path: Path) -> dict[str, str]:
    assert connection.vendor == "postgresql", "the fleet test runs on PostgreSQL"
    redis.Redis.from_url(BROKER).flushdb()  # fails (never skips) when Redis is down
    return _fleet_env(tmp_path)


def _proxied(env: dict[str, str], proxy: PgProxy) -> dict[str, str]:
    db = connection.settings_dict
    return {**env, "DATABASE_URL": f"postgres://{db['USER'] or 'root'}@127.0.0.1:{proxy.port}/"
                                   f"{db['NAME']}"}


def _settled(keys: list[str]) -> bool:
    states = dict(Operation.objects.filter(submission_key__in=keys)
                  .values_list("submission_key", "state"))
    return all(states.get(k) in SETTLED for k in states)


# Each pool's workers meet the cuts on their own threads: prefork children, or the thread pool's
# threads in the worker's own process (one connection per thread either way).
@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_database_cut_at_submit_reply_result_store_and_acceptance(
    mcp_url: str, cut_env: dict[str, str], tmp_path: Path, pool: str
) -> None:
    server = server_add(name=SERVER, url=mcp_url)
    ToolServer.objects.filter(pk=server.pk).update(max_qps=1000.0)
    run = str(int(time.time()))
    keys = [f"dbcut-{run}-{i}" for i in range(CALLS)]
    before = peer_stats(mcp_url)
    proxy = PgProxy()
    env = _proxied(cut_env, proxy)
    aims = {
        # The first reply cut is shorter than the write's retries, the second longer. Only the
        # first match fires at once; later firings let 3 matches pass, so each lands on a
        # different row's write rather than on the retry of the one just cut.
        "submit_reply": proxy.cut_on(b'UPDATE "ledger_operation" SET "remote_id" = ', [2.0, 6.0],
                                     skip=3),
        # The result store: the step-by-step store, or the terminal poll's one write that holds it.
        "result_store": proxy.cut_on(b'UPDATE "ledger_operation" SET "result" = ', [2.0], skip=3),
        "acceptance": proxy.cut_on(b'INSERT INTO "ledger_terminalreceipt"', [2.0, 4.0], skip=3),
    }
    worker_args = ["worker", "--concurrency", "1", "--pool", pool, "--without-gossip",
                   "--without-mingle", "-l", "info"]
    procs = [
        _start(["beat", "-s", str(tmp_path / "beat-schedule"), "-l", "info"], env,
               tmp_path / "beat.log"),
        _start([*worker_args, "-n", "cut1@%h"], env, tmp_path / "worker1.log"),
        _start([*worker_args, "-n", "cut2@%h"], env, tmp_path / "worker2.log"),
    ]
    submitter = subprocess.Popen(
        [sys.executable, "manage.py", "shell", "-c",
         SUBMITTER.format(calls=CALLS, run=run, server=SERVER)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=open(tmp_path / "submitter.log", "ab"),
        text=True, start_new_session=True,
    )
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(submitter.stdout or []), daemon=True)
    reader.start()
    try:
        # A blind cut once half of the calls were submitted, wherever it lands.
        _wait_for(lambda: len(out) >= CALLS // 2 or not reader.is_alive(), 180,
                  "half of the calls to be submitted")
        proxy.cut(3.0, why="blind")
        submitter.wait(timeout=240)
        reader.join(timeout=10)
        _wait_for(lambda: _settled(keys), 180, "every call to reach a receipt or the queue")
    finally:
        if submitter.poll() is None:
            submitter.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
        sys.stderr.write(f"submitter exit code: {submitter.poll()}; proxy: connections="
                         f"{proxy.connections} refused={proxy.refused} cuts={proxy.cuts}\n")
        for proc in [*procs, submitter]:
            _kill(proc, signal.SIGTERM) if proc.poll() is None else None
        proxy.close()
        for log in sorted(tmp_path.glob("*.log")):
            sys.stderr.write(f"--- {log.name} (tail) ---\n{log.read_text()[-2000:]}\n")

    lines = [json.loads(line) for line in out if line.startswith("{")]
    assert [line["key"] for line in lines] == keys
    stats = peer_stats(mcp_url)
    calls_seen = {k: stats["submission_keys"].get(k, 0) for k in keys}
    # No duplicate tools/call, whatever was cut.
    assert all(n <= 1 for n in calls_seen.values()), calls_seen
    assert (stats["tool_calls"].get("sleep_then_complete", 0)
            - before["tool_calls"].get("sleep_then_complete", 0)) == sum(calls_seen.values())
    outcomes: dict[str, int] = {}
    for line in lines:
        key = line["key"]
        op = Operation.objects.filter(submission_key=key).first()
        if calls_seen[key] == 0:
            # Refused before anything was sent (the row could not even be written): no receipt,
            # and the caller was told.
            assert op is None or not TerminalReceipt.objects.filter(operation=op).exists()
            assert not line["ok"], line
            outcomes["never_sent"] = outcomes.get("never_sent", 0) + 1
            continue
        assert op is not None, line
        if not line["ok"]:
            # The server has the call: the caller's error is ours and typed, never the driver's.
            assert line["type"].startswith("toolops."), line
        # The remote id the submitting process had in its hands: from its result, or named by
        # its typed error (the reference server runs without key lookup here, the hard case).
        named = re.search(r"task '([^']+)'", line.get("message", ""))
        seen = line.get("remote_id") or (named.group(1) if named else None)
        if op.state == State.ACCEPTED:
            assert TerminalReceipt.objects.filter(call_node_id=key).count() == 1
            assert op.remote_id and (seen is None or op.remote_id == seen), (line, op.remote_id)
            outcomes["accepted"] = outcomes.get("accepted", 0) + 1
        else:
            assert op.state == State.RECONCILIATION_REQUIRED, (key, op.state)
            item = ReconciliationItem.objects.get(operation=op, status="open")
            assert seen and seen in json.dumps(item.evidence, default=str), (line, item.reason)
            outcomes["queued"] = outcomes.get("queued", 0) + 1
    assert outcomes.get("accepted", 0) >= CALLS // 2, outcomes  # the run did real work
    fired = {name: len(aim.fired) for name, aim in aims.items()}
    # Every aimed point was really cut (the statements exist in every cycle).
    assert all(n >= 1 for n in fired.values()), fired
    report = gate_report(server_names=[SERVER])
    assert report.passed, report.as_dict()
    assert report.figure("stranded_open_rows").value == 0
    crashes = list(Operation.objects.filter(server=server, events__kind="executor_error")
                   .values_list("events__data__type", flat=True))
    summary: dict[str, Any] = {"calls": CALLS, "outcomes": outcomes, "cuts_fired": fired,
                               "cuts": len(proxy.cuts), "refused_connections": proxy.refused,
                               "recorded_crashes": len(crashes),
                               "submit_errors": sorted({ln["type"] for ln in lines if not ln["ok"]})}
    print(f"\nfleet dbcut: {json.dumps(summary, sort_keys=True)}")
