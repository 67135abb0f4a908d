"""Benchmark (not a test): N in-flight operations polled to their receipts under a per-server QPS cap.

The fake server is an in-process httpx transport speaking the MCP 2025-11-25 task shape
(`tasks/get`, `tasks/result`), so the figures measure our executor (claims, SQL, buckets), not the
network. Each task completes `--complete-after` seconds after the run starts. The executor is the
embedded runner, `--workers` copies of it in threads (each its own lease owner, DB connection and
poll loop), all sharing the server's bucket (Redis by default: the fleet's bucket).

Prints:
- peak requests in any one-second window at the server / configured QPS (must be <= 1.0), from
  the fake server's own arrival times (exact sliding window) and from the bucket's counters;
- polls per completed operation;
- dispatcher claim time per 1,000 rows (claiming from all N due rows);
- SQL statements per poll cycle (Django's query capture): overall, and per kind of cycle.

Run (PostgreSQL and Redis, as a fleet would):
    DATABASE_URL=postgres://root@127.0.0.1:5432/toolops_bench CELERY_BROKER_URL=redis://127.0.0.1:6379/5 \
        .venv/bin/python manage.py migrate -v0 && \
    DATABASE_URL=... CELERY_BROKER_URL=... .venv/bin/python benchmarks/poll_fleet.py --ops 10000 --qps 200
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import secrets
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from ledger.digests import request_digest  # noqa: E402
from ledger.models import Operation, ToolServer  # noqa: E402
from ledger.states import State  # noqa: E402
from toolops.qps import LocalTokenBucket, qps_bucket_replace  # noqa: E402
from toolops.runner import run_embedded  # noqa: E402
from toolops.services.connections import connections_use_transport  # noqa: E402
from toolops.services.dispatch import operations_claim_due  # noqa: E402
from toolops.services.observe import operation_poll  # noqa: E402
from toolops.services.poll_report import poll_report_reset, poll_report_servers  # noqa: E402

RELATED = "io.modelcontextprotocol/related-task"


class FakeTaskServer(httpx.BaseTransport):
    """MCP 2025-11-25 tasks/get and tasks/result, answered from memory; records arrival times."""

    def __init__(self, *, complete_at: float, poll_interval_ms: int) -> None:
        self.complete_at = complete_at
        self.poll_interval_ms = poll_interval_ms
        self.arrivals: list[float] = []
        self.methods: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.created = timezone.now().isoformat()

    def _task(self, task_id: str) -> dict[str, Any]:
        done = time.time() >= self.complete_at
        return {"taskId": task_id, "status": "completed" if done else "working",
                "createdAt": self.created, "lastUpdatedAt": self.created,
                "ttl": 3_600_000, "pollInterval": self.poll_interval_ms}

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        now = time.time()
        body = json.loads(request.content)
        method = body["method"]
        with self._lock:
            self.arrivals.append(now)
            self.methods[method] += 1
        task_id = body["params"]["taskId"]
        if method == "tasks/get":
            result: dict[str, Any] = self._task(task_id)
        elif method == "tasks/result":
            result = {"content": [{"type": "text", "text": f"done {task_id}"}], "isError": False,
                      "_meta": {RELATED: {"taskId": task_id}}}
        else:
            return httpx.Response(200, json={"jsonrpc": "2.0", "id": body["id"],
                                             "error": {"code": -32601, "message": method}})
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": body["id"], "result": result})

    def peak_in_any_second(self) -> int:
        times = sorted(self.arrivals)
        best = 0
        for i, t in enumerate(times):
            # requests in the half-open window [t, t + 1)
            best = max(best, bisect.bisect_left(times, t + 1.0, lo=i) - i)
        return best


def _make_server(*, qps: float, run: str) -> ToolServer:
    return ToolServer.objects.create(
        name=f"bench-{run}", url="http://fake.invalid/mcp", adapter_version="mcp-tasks/2025-11-25",
        protocol_version="2025-11-25", session_id=f"bench-{run}", max_qps=qps,
        capabilities={"tasks": {"requests": {"tools": {"call": {}}}}},
        tools={"render": {"task_support": "required", "descriptor_digest": "sha256:bench",
                          "descriptor": {"name": "render"}}},
    )


def _make_rows(*, server: ToolServer, n: int, run: str, poll_interval_ms: int) -> None:
    now = timezone.now()
    digest = request_digest(tool_name="render", arguments={}, descriptor_version="sha256:bench")
    rows = [
        Operation(
            call_node_id=f"bench-{run}-{i}", server=server, tool_name="render",
            descriptor_version="sha256:bench", request_digest=digest,
            body={"name": "render", "arguments": {}}, adapter_version=server.adapter_version,
            submission_key=secrets.token_hex(16), remote_id=f"task-{run}-{i}",
            state=State.WORKING, server_state="working", next_poll_at=now,
            poll_interval_ms=poll_interval_ms, ttl_ms=3_600_000,
            expires_at=now + timedelta(hours=1),
        )
        for i in range(n)
    ]
    Operation.objects.bulk_create(rows, batch_size=2000)


def _claim_time_per_1000(*, server: ToolServer, n: int) -> float:
    """Claim every due row in batches of 1,000, then hand them back untouched."""
    rounds, elapsed = 0, 0.0
    while True:
        started = time.perf_counter()
        ids = operations_claim_due(owner="bench-claim", limit=1000)
        elapsed += time.perf_counter() - started
        if not ids:
            break
        rounds += len(ids) / 1000.0
    Operation.objects.filter(server=server).update(lease_owner="", lease_expires_at=None,
                                                   poll_attempts=0, next_poll_at=timezone.now())
    return elapsed / rounds if rounds else 0.0


def _sql_per_cycle_sample(*, server: ToolServer, run: str, poll_interval_ms: int,
                          sample: int) -> dict[str, float]:
    """Statements per poll cycle by kind, measured one cycle at a time in this thread."""
    _make_rows(server=server, n=sample, run=f"{run}-s", poll_interval_ms=poll_interval_ms)
    per_kind: dict[str, list[int]] = {}
    ids = list(Operation.objects.filter(call_node_id__startswith=f"bench-{run}-s-")
               .values_list("id", flat=True))
    claim_sql = []
    for op_id in ids:
        Operation.objects.filter(id=op_id).update(next_poll_at=timezone.now())
    while True:
        with CaptureQueriesContext(connection) as claim:
            claimed = operations_claim_due(owner="bench-sql", limit=50)
        if not claimed:
            break
        claim_sql.append(len(claim.captured_queries) / len(claimed))
        for op_id in claimed:
            with CaptureQueriesContext(connection) as poll:
                outcome = operation_poll(operation_id=op_id, lease_owner="bench-sql").split(":")[0]
            per_kind.setdefault(outcome, []).append(len(poll.captured_queries))
        # leave the rest to the main run
        if sum(len(v) for v in per_kind.values()) >= sample:
            break
    figures: dict[str, float] = {f"poll:{k}": round(sum(v) / len(v), 2) for k, v in per_kind.items()}
    figures["claim_per_row"] = round(sum(claim_sql) / len(claim_sql), 3) if claim_sql else 0.0
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--qps", type=float, default=200.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--poll-interval-ms", type=int, default=1000)
    parser.add_argument("--complete-after", type=float, default=5.0,
                        help="seconds after the start at which every task reports completed")
    parser.add_argument("--bucket", choices=["redis", "local"], default="redis")
    parser.add_argument("--max-seconds", type=float, default=900.0)
    args = parser.parse_args()

    from toolops.services.dispatch import CLAIMABLE

    others = Operation.objects.filter(state__in=CLAIMABLE).count()
    if others:
        print(f"{others} operations are already in flight in this database; the benchmark needs "
              "a ledger of its own (point DATABASE_URL at an empty, migrated database)",
              file=sys.stderr)
        return 2
    if args.bucket == "local":
        qps_bucket_replace(LocalTokenBucket())
    run = secrets.token_hex(3)
    server = _make_server(qps=args.qps, run=run)
    poll_report_reset(server_id=server.pk)
    _make_rows(server=server, n=args.ops, run=run, poll_interval_ms=args.poll_interval_ms)
    claim_s = _claim_time_per_1000(server=server, n=args.ops)

    fake = FakeTaskServer(complete_at=time.time() + args.complete_after,
                          poll_interval_ms=args.poll_interval_ms)
    connections_use_transport(lambda _server: fake)

    statements = Counter[str]()

    def counting(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements["sql"] += 1
        return execute(sql, params, many, context)

    outcomes: Counter[str] = Counter()
    lock = threading.Lock()

    def worker() -> None:
        try:
            with connection.execute_wrapper(counting):
                stats = run_embedded(until_idle=True, max_seconds=args.max_seconds)
            with lock:
                outcomes.update(stats.outcomes)
        finally:
            connection.close()

    started = time.time()
    threads = [threading.Thread(target=worker) for _ in range(args.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.time() - started

    accepted = Operation.objects.filter(server=server, state=State.ACCEPTED).count()
    (report,) = [r for r in poll_report_servers(names=[server.name])]
    peak = fake.peak_in_any_second()
    gets = fake.methods["tasks/get"]
    requests = dict(fake.methods)
    polled_cycles = sum(outcomes.values())
    # Per-kind figures on extra rows, measured after the main run (tasks are complete by now,
    # and the bucket is still the shared one, so refusals show up as their own kind).
    n_sample = min(200, args.ops)
    fake.complete_at = time.time() + 1e9  # cycles that observe "working"
    sample = _sql_per_cycle_sample(server=server, run=f"{run}w", poll_interval_ms=args.poll_interval_ms,
                                   sample=n_sample)
    fake.complete_at = 0.0  # cycles that observe "completed", fetch and accept
    sample.update({k: v for k, v in _sql_per_cycle_sample(
        server=server, run=f"{run}c", poll_interval_ms=args.poll_interval_ms, sample=n_sample,
    ).items() if k != "claim_per_row"})
    figures = {
        "ops": args.ops, "workers": args.workers, "bucket": args.bucket,
        "configured_qps": args.qps, "elapsed_s": round(elapsed, 1),
        "accepted": accepted,
        "server_peak_requests_in_any_1s": peak,
        "peak_over_configured_server_side": round(peak / args.qps, 3),
        "bucket_peak_requests_in_a_calendar_second": report.peak_requests_in_one_second,
        "peak_over_configured_bucket": report.peak_over_configured,
        "requests": requests,
        "bucket_requests": report.requests_by_purpose,
        "mean_requests_per_s": round(sum(requests.values()) / elapsed, 1),
        "polls_per_completed_operation": round(gets / accepted, 3) if accepted else None,
        "claim_ms_per_1000_rows": round(claim_s * 1000, 1),
        "sql_per_poll_cycle_overall": round(statements["sql"] / polled_cycles, 2)
        if polled_cycles else None,
        "poll_cycles_by_outcome": dict(outcomes),
        "sql_per_cycle_by_kind_sample": sample,
    }
    print(json.dumps(figures, indent=2, sort_keys=True))
    # Leave no row in flight: the next run must find an idle ledger.
    fake.complete_at = 0.0
    run_embedded(until_idle=True, max_seconds=args.max_seconds)
    connections_use_transport(None)
    ok = accepted == args.ops and peak <= args.qps
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
