"""Benchmark (not a test): claims while the due table churns, with and without its upkeep.

A fleet moves every open row's due entry several times per call (the submit's reply, the claim,
a working poll, a lease renewal), and each move leaves a dead version in the due index at the
old time, in front of the next claim's walk (ledger/services/due.py). This loads `--rows` open
WORKING rows, all due, then runs `--rounds` rounds of: claim `--batch` rows, then hand them back
due again at once (a poll that wrote its next time), as a fleet does, with the dispatcher's
upkeep (`operations_due_upkeep`, TOOLOPS_DUE_VACUUM_* as configured) after each round or
without it. Both modes run on the same table, one after the other, `--repeat` times each, so
they are compared in one run. Prints, per mode, the median ms of a claim in the first and last
quarter of its rounds, the dead versions left at the end, and the vacuums made.

Run against a scratch PostgreSQL database (it is emptied first):
    DATABASE_URL=postgres://root@127.0.0.1:5432/toolops_churn_<you> .venv/bin/python manage.py migrate -v0
    DATABASE_URL=postgres://root@127.0.0.1:5432/toolops_churn_<you> \\
        .venv/bin/python benchmarks/due_churn.py --rows 5000 --rounds 300 --batch 50
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

from toolops.services.dispatch import operations_claim_due, operations_due_upkeep


def _dead() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cur:
        cur.execute("SELECT n_dead_tup FROM pg_stat_user_tables "
                    "WHERE relid = 'ledger_operationdue'::regclass")
        return int(cur.fetchone()[0])


def _rounds(*, rounds: int, batch: int, upkeep: bool) -> dict[str, object]:
    timings: list[float] = []
    vacuums = 0
    for i in range(rounds):
        started = time.perf_counter()
        ids = operations_claim_due(owner=f"churn-{upkeep}-{i}", limit=batch)
        timings.append((time.perf_counter() - started) * 1000)
        with connection.cursor() as cur:
            cur.execute("UPDATE ledger_operation SET lease_owner = '', lease_expires_at = NULL, "
                        "next_poll_at = now() - interval '1 second' WHERE id = ANY(%s)", [ids])
        if upkeep:
            vacuums += int(operations_due_upkeep())
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
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        raise SystemExit("due_churn needs PostgreSQL")
    claims_at_scale._load(rows=args.rows, leased_due=0)
    for _ in range(args.repeat):
        for upkeep in (False, True):
            with connection.cursor() as cur:
                cur.execute("VACUUM ledger_operationdue")  # each mode starts from a clean table
            print(json.dumps(_rounds(rounds=args.rounds, batch=args.batch, upkeep=upkeep)),
                  flush=True)


if __name__ == "__main__":
    main()
