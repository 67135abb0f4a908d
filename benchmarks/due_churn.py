"""Benchmark (not a test): claims while the due table churns, with and without vacuums.

A fleet moves every open row's due entry several times per call (the submit's reply, the claim,
a working poll, a lease renewal), and each move leaves a dead version in the due index at the
old time, in front of the next claim's walk (docs/architecture.md, "The due table"). This loads
`--rows` open WORKING rows, all due, then runs `--rounds` rounds of: claim `--batch` rows, then
hand them back due again at once (a poll that wrote its next time), as a fleet does, with the
due table vacuumed at most every `--vacuum-every` seconds after a round, or never. Both modes
run on the same table, one after the other, `--repeat` times each, so they are compared in one
run. Prints, per mode, the median ms of a claim in the first and last quarter of its rounds,
the dead versions left at the end, and the vacuums made (their time is not in the claims').

Run against a scratch PostgreSQL database (it is emptied first):
    DATABASE_URL=postgres://root@127.0.0.1:5432/toolops_churn_<you> .venv/bin/python manage.py migrate -v0
    DATABASE_URL=postgres://root@127.0.0.1:5432/toolops_churn_<you> \\
        .venv/bin/python benchmarks/due_churn.py --rows 5000 --rounds 2000 --batch 200 --repeat 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import claims_at_scale
from django.db import connection

from toolops.services.dispatch import operations_claim_due


def _dead() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cur:
        cur.execute("SELECT n_dead_tup FROM pg_stat_user_tables "
                    "WHERE relid = 'ledger_operationdue'::regclass")
        return int(cur.fetchone()[0])


def _rounds(*, rounds: int, batch: int, upkeep: bool, every: float) -> dict[str, object]:
    timings: list[float] = []
    vacuums = 0
    last = time.monotonic()
    for i in range(rounds):
        started = time.perf_counter()
        ids = operations_claim_due(owner=f"churn-{upkeep}-{i}", limit=batch)
        timings.append((time.perf_counter() - started) * 1000)
        with connection.cursor() as cur:
            cur.execute("UPDATE ledger_operation SET lease_owner = '', lease_expires_at = NULL, "
                        "next_poll_at = now() - interval '1 second' WHERE id = ANY(%s)", [ids])
        if upkeep and time.monotonic() - last >= every:
            with connection.cursor() as cur:
                cur.execute("VACUUM ledger_operationdue")
            vacuums += 1
            last = time.monotonic()
    quarter = max(len(timings) // 4, 1)
    return {"upkeep": upkeep, "rounds": len(timings), "batch": batch,
            "ms_first_quarter_median": round(statistics.median(timings[:quarter]), 3),
            "ms_last_quarter_median": round(statistics.median(timings[-quarter:]), 3),
            "dead_versions_at_end": _dead(), "vacuums": vacuums}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--vacuum-every", type=float, default=1.0)
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        raise SystemExit("due_churn needs PostgreSQL")
    claims_at_scale._load(rows=args.rows, leased_due=0)
    for _ in range(args.repeat):
        for upkeep in (False, True):
            with connection.cursor() as cur:
                cur.execute("VACUUM ledger_operationdue")  # each mode starts from a clean table
            print(json.dumps(_rounds(rounds=args.rounds, batch=args.batch, upkeep=upkeep,
                                     every=args.vacuum_every)),
                  flush=True)


if __name__ == "__main__":
    main()
