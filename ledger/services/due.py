"""Upkeep of the due table (ledger.models.due) on PostgreSQL: vacuumed as often as a queue is.

Every write that moves a row's schedule or lease writes a new version of its due entry, and
since `due_at` is indexed that is never a HOT update: the old version stays behind in the heap,
in the primary key and in `opdue_due_idx` at its old `due_at`, which is in the past. The claim
walks that index from its oldest end up to now, so it reads every dead entry left there since
the table was last vacuumed, and a lease renewal's lookup by key reads the row's dead versions.
Autovacuum visits a table at most once per `autovacuum_naptime` (a minute by default): a fleet
moving a few hundred calls a second leaves tens of thousands of dead entries in front of every
claim in that minute. Measured in the perf harness's fleet (5,000 calls, toolops-only, with
`pg_stat_statements`): a claim read 728 buffers and took 3.8 ms on average, a lease renewal
187 buffers and 0.93 ms; with the table vacuumed about once a second, 212 and 1.0 ms, 35 and
0.34 ms, for 12 ms per vacuum.

The table is narrow and holds only open rows, so a vacuum costs a few milliseconds. It takes
SHARE UPDATE EXCLUSIVE, which no insert, update, delete or claim waits for, and SKIP_LOCKED
makes a second vacuum started meanwhile skip the table instead of queueing behind the first.
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connections

from ledger.models import OperationDue


def due_table_vacuum_when_due(*, every_seconds: float, dead_rows: int,
                              using: str = DEFAULT_DB_ALIAS) -> bool:
    """VACUUM the due table when it holds at least `dead_rows` dead versions and no process
    vacuumed it within `every_seconds`. Both are read from PostgreSQL's statistics, so all the
    fleet's dispatchers keep one pace between them, and an idle or slow ledger is left to
    autovacuum. Returns whether this call vacuumed.

    Only on PostgreSQL and outside a transaction (VACUUM cannot run in one); elsewhere it does
    nothing. A role that does not own the table gets PostgreSQL's warning instead of a vacuum
    and nothing else changes."""
    connection = connections[using]
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return False
    table = OperationDue._meta.db_table
    with connection.cursor() as cursor:
        # `last_vacuum` is written into shared statistics by the vacuum itself, so every session
        # sees it at once (NULL: never vacuumed by hand); `n_dead_tup` trails the writes by up
        # to a second, as each backend reports its counts.
        cursor.execute(
            "SELECT n_dead_tup >= %s AND (last_vacuum IS NULL "
            "OR last_vacuum < now() - make_interval(secs => %s)) "
            "FROM pg_stat_user_tables WHERE relid = %s::regclass",
            [dead_rows, every_seconds, table],
        )
        row = cursor.fetchone()
        if row is None or not row[0]:
            return False
        cursor.execute(f'VACUUM (SKIP_LOCKED) "{table}"')
    return True
