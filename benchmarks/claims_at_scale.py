"""Benchmark (not a test): dispatcher claims at scale, while leased rows accumulate.

Loads `--rows` open WORKING rows, all due, with one `INSERT ... SELECT generate_series` (seconds
for 1M rows), then claims `--batch` rows at a time, `--claims` times, never releasing a lease (the
worst case: every claimed row is still in flight). Prints ms per claim, and how many of the
claims' writes of operation rows were HOT updates (no index entry written; the reason the due
times live in their own narrow table, ledger.models.due). `--leased-due N` first leases the N
earliest-due rows while leaving them due (a poll that wrote its next time before it let go of
the lease, on a worker still running): they are the front of the due order and no claim may take
them.

It also prints, per claim, the full-page images and megabytes the claims wrote to the WAL and the
dirty buffers the claiming backend had to write out itself (cluster-wide counters: run it on an
otherwise idle server): the first write of a page after a checkpoint logs the whole page, and a
ledger larger than `shared_buffers` makes each claim evict pages of its own. The load writes
more WAL than a default `max_wal_size`, so a checkpoint usually starts as the claims begin;
`--checkpoint-first` runs `CHECKPOINT` (a superuser's or pg_checkpoint's right) after the load,
so the claims start after a finished one instead.

Run against a scratch PostgreSQL database (it is emptied first):
    DATABASE_URL=postgres://root@127.0.0.1:5432/toolops_claims_<you> .venv/bin/python manage.py migrate -v0
    DATABASE_URL=postgres://root@127.0.0.1:5432/toolops_claims_<you> \\
        .venv/bin/python benchmarks/claims_at_scale.py --rows 1000000 --batch 1000 --claims 100
    ... claims_at_scale.py --rows 1000000 --claims 100 --leased-due 90000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django

django.setup()

from django.db import connection  # noqa: E402

from ledger.models import ToolServer  # noqa: E402
from toolops.services.dispatch import operations_claim_due  # noqa: E402


def _load(*, rows: int, leased_due: int, checkpoint_first: bool) -> None:
    with connection.cursor() as cur:
        cur.execute("TRUNCATE ledger_operationevent, ledger_operation, ledger_toolserver CASCADE")
    server = ToolServer.objects.create(name="claims-bench", url="http://127.0.0.1:1/mcp",
                                       adapter_version="mcp-tasks/2025-11-25")
    started = time.monotonic()
    with connection.cursor() as cur:
        # Every NOT NULL column Django fills from a Python default, given here in SQL; due times
        # spread over the last ten minutes so the claim's ORDER BY has work to do.
        cur.execute(
            """
            INSERT INTO ledger_operation (
                id, call_node_id, server_id, tool_name, descriptor_version, request_digest, body,
                adapter_version, execution_mode, submission_key, tenant, submission_digest,
                remote_id, state, server_state, server_status_message, next_poll_at,
                poll_attempts, observation_seq, lease_owner, lease_expires_at, input_round,
                cancel_generation, execution_epoch, executor_path, shadow, terminal_status,
                result_kind, result_digest, created_at, updated_at, polls_count,
                poll_errors_in_row)
            SELECT md5(i::text || 'op')::uuid, 'node-' || i, %s, 'work', 'sha256:d', 'sha256:r',
                   '{}'::jsonb, 'mcp-tasks/2025-11-25', 'task', md5(i::text), '', '',
                   'task-' || i, 'WORKING', 'working', '',
                   now() - (random() * interval '10 minutes'),
                   0, 0, '', NULL, 0, 0, 1, 'tasks', false, '', '', '', now(), now(), 0, 0
            FROM generate_series(1, %s) AS i
            """,
            [server.pk, rows],
        )
        # Leased for the whole run and still due: the rows a claim must skip, not walk.
        cur.execute(
            """
            UPDATE ledger_operation SET lease_owner = 'bench-in-flight',
                   lease_expires_at = now() + interval '1 hour'
            WHERE id IN (SELECT id FROM ledger_operation ORDER BY next_poll_at LIMIT %s)
            """,
            [leased_due],
        )
        # A quiet table: the load's dead tuples and unset hint bits are not the claim's cost.
        cur.execute("VACUUM (ANALYZE) ledger_operation")
        cur.execute("VACUUM (ANALYZE) ledger_operationdue")
        if checkpoint_first:
            cur.execute("CHECKPOINT")
    print(json.dumps({"loaded_rows": rows, "leased_due": leased_due,
                      "checkpoint_first": checkpoint_first,
                      "load_s": round(time.monotonic() - started, 2)}), flush=True)


def _counters() -> dict[str, int | None]:
    """The server's counters so far, read after one flush of this backend's pending statistics:
    the operation table's updates and how many were HOT (no index entry written), full-page
    images and bytes written to the WAL, and buffers that backends had to write out themselves to
    make room (None where pg_stat_bgwriter no longer reports it, PostgreSQL 17 on)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
        cur.execute("SELECT t.n_tup_upd, t.n_tup_hot_upd, w.wal_fpi, w.wal_bytes, "
                    "(to_jsonb(b) ->> 'buffers_backend')::bigint "
                    "FROM pg_stat_user_tables AS t, pg_stat_wal AS w, pg_stat_bgwriter AS b "
                    "WHERE t.relname = 'ledger_operation'")
        names = ("upd", "hot", "fpi", "wal_bytes", "backend_writes")
        return {name: None if value is None else int(value)
                for name, value in zip(names, cur.fetchone(), strict=True)}


def _run(*, batch: int, claims: int) -> dict[str, object]:
    timings = []
    before = _counters()
    for i in range(claims):
        owner = f"bench-{i}"
        started = time.perf_counter()
        ids = operations_claim_due(owner=owner, limit=batch)
        timings.append((time.perf_counter() - started) * 1000)
        if len(ids) < batch:
            break
    after = _counters()

    def grew(name: str) -> int | None:
        first, last = before[name], after[name]
        return None if first is None or last is None else last - first

    quarter = max(len(timings) // 4, 1)

    def per_claim(name: str, *, scale: float = 1.0) -> float | None:
        total = grew(name)
        return None if total is None else round(total / scale / max(len(timings), 1), 2)

    return {
        "claims": len(timings), "batch": batch,
        "row_writes": grew("upd"), "hot_row_writes": grew("hot"),
        "leased_at_end": len(timings) * batch,
        "ms_first_quarter_median": round(statistics.median(timings[:quarter]), 2),
        "ms_last_quarter_median": round(statistics.median(timings[-quarter:]), 2),
        "ms_max": round(max(timings), 2),
        "wal_fpi_per_claim": per_claim("fpi"),
        "wal_mb_per_claim": per_claim("wal_bytes", scale=1e6),
        "backend_buffer_writes_per_claim": per_claim("backend_writes"),
        "ms_per_claim": [round(t, 1) for t in timings],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--leased-due", type=int, default=0)
    parser.add_argument("--checkpoint-first", action="store_true",
                        help="CHECKPOINT after the load, so none is under way as the claims begin")
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        raise SystemExit("claims_at_scale needs PostgreSQL (SKIP LOCKED, generate_series)")
    # A lease long enough that no claimed row becomes due again during the run.
    from django.conf import settings

    settings.TOOLOPS_LEASE_SECONDS = 600.0
    _load(rows=args.rows, leased_due=args.leased_due, checkpoint_first=args.checkpoint_first)
    print(json.dumps(_run(batch=args.batch, claims=args.claims)), flush=True)


if __name__ == "__main__":
    main()
