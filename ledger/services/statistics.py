"""Planner statistics of the ledger's tables, refreshed when a table has outgrown them.

Why: the executor's hot statements are prepared once per session (server-side binding), and
after a few executions PostgreSQL keeps one generic plan per statement until something
invalidates it. A plan made while a table was nearly empty (a new deployment, a benchmark's
warm-up, the due table between two bursts) is shaped for that size: a sequential scan to find a
few rows by key is cheapest in a table of three pages, and stays in the plan cache while the table
grows to thousands of pages. The claim, the held rows' lease renewal and the batch load then read
the whole operation table on every execution (measured in a 5,000-call burst: the claim read
about 1,000 buffers for 8 rows, the renewal about 190 for 2). Autovacuum analyzes such a table
only after its naptime (a minute by default), which a burst can outlast.

ANALYZE refreshes the statistics and invalidates every cached plan that reads the table, so each
session plans again at the next execution. This runs it only when a table has grown well past
what its statistics say (`growth` times their row count, and at least `min_rows` more), which on a
growing table is a handful of times in all (at each doubling), never in steady state, where
autovacuum keeps the statistics current.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import DatabaseError, connections, router, transaction

from ledger.models import Operation, OperationDue

logger = logging.getLogger("ledger.statistics")

# ANALYZE waits at most this long for its lock (SHARE UPDATE EXCLUSIVE, taken by autovacuum and
# by another dispatcher's ANALYZE): if either holds it, the statistics are being refreshed anyway.
LOCK_TIMEOUT_MS = 100

_lock = threading.Lock()
_next_check = 0.0

# Row counts as the planner has them (reltuples, -1 when never analyzed) beside the live rows the
# statistics system counts; only tables this role may analyze (owner or superuser).
_GROWN_SQL = """
SELECT c.relname, GREATEST(c.reltuples, 0)::bigint, s.n_live_tup
FROM pg_class AS c JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.relname = ANY(%s) AND s.schemaname = current_schema()
  AND pg_has_role(c.relowner, 'USAGE')
  AND s.n_live_tup >= GREATEST(c.reltuples, 0) * %s + %s
"""


# The tables whose hot statements find several rows by key (the claim, the lease renewal, the
# batch load). The append-mostly tables (events, receipts, outbox) are written by key and read by
# index whatever their size, and analyzing them cost more than the operation table (130 ms for
# 30,000 events): they are left to autovacuum.
REFRESHED_MODELS = (Operation, OperationDue)


def ledger_statistics_refresh_grown(*, growth: float, min_rows: int,
                                    min_interval_s: float = 0.0) -> list[str]:
    """ANALYZE each table of REFRESHED_MODELS whose live rows reached `growth` times the planner's count plus
    `min_rows`; returns the tables analyzed. At most one check per `min_interval_s` in this
    process (the check is one catalog query). PostgreSQL only; `growth <= 0` turns it off."""
    global _next_check
    alias = router.db_for_write(Operation)  # the ledger's database, as every ledger write finds it
    connection = connections[alias]
    if growth <= 0 or connection.vendor != "postgresql":
        return []
    with _lock:
        now = time.monotonic()
        if now < _next_check:
            return []
        _next_check = now + min_interval_s
    with connection.cursor() as cursor:
        cursor.execute(_GROWN_SQL, [[m._meta.db_table for m in REFRESHED_MODELS], growth, min_rows])
        grown = cursor.fetchall()
    analyzed = []
    for table, planned, live in grown:
        try:
            with transaction.atomic(using=alias), connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
                cursor.execute(f"ANALYZE {connection.ops.quote_name(table)}")
        except DatabaseError as exc:  # lock not granted in time: someone else is analyzing it
            logger.info("statistics of %s not refreshed: %s", table, type(exc).__name__)
            continue
        logger.info("statistics of %s refreshed: %d live rows, the planner had %d", table, live, planned)
        analyzed.append(table)
    return analyzed
