"""Benchmark (not a test): what waiting for the WAL flush costs a bookkeeping write.

`--threads` threads, each with its own connection, write `--writes` guarded UPDATEs of their own
leased rows, as a working poll records its schedule and counters (`guarded_update`, one statement
in autocommit), once with `defer_flush` (ledger/flush.py) and once without, alternating for
`--rounds` rounds so that drift in the machine's speed falls on both. Prints, per write: the whole
box's busy CPU (/proc/stat: the client, PostgreSQL, its WAL writer and the kernel's I/O work),
the wall time, and the WAL flushes PostgreSQL made (`pg_stat_wal.wal_sync`); then the medians
and their ratio.

Run against a scratch PostgreSQL database (its operation rows are emptied first):
    DATABASE_URL=postgres://root@127.0.0.1:5432/toolops_flush_<you> .venv/bin/python manage.py migrate -v0
    DATABASE_URL=postgres://root@127.0.0.1:5432/toolops_flush_<you> \\
        .venv/bin/python benchmarks/deferred_flush.py --threads 8 --writes 500 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django

django.setup()

from django.db import connection, connections  # noqa: E402
from django.utils import timezone  # noqa: E402

from ledger.models import Operation, ToolServer  # noqa: E402
from ledger.services.guarded import guarded_update  # noqa: E402
from ledger.states import State  # noqa: E402


def _box_busy_seconds() -> float:
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _wal_syncs() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT wal_sync FROM pg_stat_wal")
        return int(cursor.fetchone()[0])


def _rows(*, count: int) -> list[uuid.UUID]:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE ledger_operationevent, ledger_operation, ledger_toolserver CASCADE")
    server = ToolServer.objects.create(name="flush-bench", url="http://127.0.0.1:1/mcp",
                                       adapter_version="mcp-tasks/2025-11-25")
    until = timezone.now() + timedelta(hours=1)
    ops = [Operation(call_node_id=f"flush-{i}", server=server, tool_name="work",
                     submission_key=f"flush-{i}", remote_id=f"task-{i}", state=State.WORKING,
                     server_state="working", lease_owner="bench", lease_expires_at=until,
                     next_poll_at=until) for i in range(count)]
    Operation.objects.bulk_create(ops)
    return [op.id for op in ops]


def _round(*, ids: list[uuid.UUID], threads: int, writes: int, defer_flush: bool) -> dict[str, float]:
    go = threading.Barrier(threads + 1)

    def work(mine: uuid.UUID) -> None:
        go.wait()
        for i in range(writes):
            guarded_update(guards={"id": mine, "lease_owner": "bench"},
                           fields={"server_status_message": f"poll {i}"}, defer_flush=defer_flush)
        connections.close_all()

    workers = [threading.Thread(target=work, args=(ids[k],)) for k in range(threads)]
    for w in workers:
        w.start()
    time.sleep(0.2)  # every thread connected and waiting
    syncs0, busy0, wall0 = _wal_syncs(), _box_busy_seconds(), time.monotonic()
    go.wait()
    for w in workers:
        w.join()
    time.sleep(0.5)  # the WAL writer's last flush and the backends' statistics reports
    wall = time.monotonic() - wall0 - 0.5
    busy, syncs = _box_busy_seconds() - busy0, _wal_syncs() - syncs0
    n = threads * writes
    return {"box_cpu_us_per_write": round(1e6 * busy / n, 1), "wall_us_per_write": round(1e6 * wall / n, 1),
            "wal_syncs_per_write": round(syncs / n, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--writes", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    ids = _rows(count=args.threads)
    runs: dict[str, list[dict[str, float]]] = {"waiting": [], "deferred": []}
    for _ in range(args.rounds):
        for name, defer in (("waiting", False), ("deferred", True)):
            result = _round(ids=ids, threads=args.threads, writes=args.writes, defer_flush=defer)
            runs[name].append(result)
            print(name, json.dumps(result), flush=True)
    medians = {name: {key: statistics.median(r[key] for r in results) for key in results[0]}
               for name, results in runs.items()}
    print("medians", json.dumps(medians))
    print("deferred / waiting:", json.dumps({key: round(medians["deferred"][key] / medians["waiting"][key], 3)
                                             for key in medians["waiting"] if medians["waiting"][key]}))


if __name__ == "__main__":
    main()
