"""Claiming due rows: the poll schedule lives in the ledger, never in broker ETAs.

One transaction claims a batch with `SELECT ... FOR UPDATE SKIP LOCKED`, so two dispatchers never
lease the same row: the second skips rows the first has locked and, after the first commits, sees
them leased. A worker that dies holding a lease stalls its rows only until the lease expires.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, cast

from django.conf import settings
from django.db import connections, router, transaction
from django.db.models import F, Field, Q
from django.utils import timezone

from ledger.flush import flush_deferrable, transaction_flush_deferred
from ledger.models import Operation, OperationDue
from ledger.models.due import CLAIM_OWNER_SETTING
from ledger.services.schedule import schedule_leased
from ledger.services.statistics import ledger_statistics_refresh_grown
from ledger.statements import statement_spelled
from ledger.states import POLLABLE, State
from toolops.services.poll_concurrency import machine_cpu_to_spare

# SUBMITTING rows are claimable only after their submitter's lease ran out (see operation_poll).
# SUBMISSION_UNKNOWN rows are claimed for their resolution pass (lookup by submission key).
CLAIMABLE = frozenset(POLLABLE | {State.SUBMITTING, State.SUBMISSION_UNKNOWN})


def claimable_now(*, now: datetime, horizon: datetime | None = None) -> Q:
    """Operation rows claimable at `now` (for reads; the claim itself walks ledger_operationdue).

    Due and free, or held by a lease that ran out (with or without a next poll time): the later
    of the next poll time and the lease's end has passed. A leased row whose lease has not run
    out is not claimable, however early its next poll time. `horizon` (a claim ahead): also the
    free rows whose next poll time comes before it."""
    lapsed_or_free = Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now)
    return (Q(state__in=CLAIMABLE) & lapsed_or_free
            & (Q(next_poll_at__isnull=True, lease_expires_at__isnull=False)
               | Q(next_poll_at__lte=horizon or now)))


def _due_scope(*, path: str | None, server_ids: Collection[int] | None,
               table: str = "") -> tuple[list[str], list[Any]]:
    """The SQL conditions and parameters that narrow due entries to one executor path and some
    servers (`table`: the due table's alias in the statement, if any)."""
    prefix = f'{table}.' if table else ""
    clauses: list[str] = []
    params: list[Any] = []
    if path is not None:
        clauses.append(f'{prefix}"executor_path" = %s')
        params.append(path)
    if server_ids is not None:
        clauses.append(f'{prefix}"server_id" = ANY(%s)')
        params.append(list(server_ids))
    return clauses, params


def _due_entries(*, path: str | None, server_ids: Collection[int] | None) -> Any:
    """The same narrowing through the ORM (the path elsewhere than PostgreSQL)."""
    rows = OperationDue.objects.all()
    if path is not None:
        rows = rows.filter(executor_path=path)
    if server_ids is not None:
        rows = rows.filter(server_id__in=list(server_ids))
    return rows


def next_claimable_at(*, path: str | None = None,
                      server_ids: Collection[int] | None = None) -> datetime | None:
    """When the earliest scheduled row (of this executor path, of these servers) becomes
    claimable: the first entry of the due index, one index read however many rows are open.

    Every dispatcher pass asks this: on PostgreSQL the statement is spelled once per alias and
    shape and replayed, not compiled by the ORM each time."""
    connection = connections[router.db_for_read(OperationDue)]
    if connection.vendor != "postgresql":
        return (_due_entries(path=path, server_ids=server_ids).order_by("due_at")
                .values_list("due_at", flat=True).first())
    clauses, params = _due_scope(path=path, server_ids=server_ids)

    def spell() -> str:
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        return f'SELECT "due_at" FROM "{OperationDue._meta.db_table}"{where} ORDER BY "due_at" LIMIT 1'

    sql = statement_spelled(site="next_claimable_at", spell=spell,
                            shape=(connection.alias, path is not None, server_ids is not None))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else row[0]


def _claimable_states_sql() -> str:
    """`state IN (...)` with the claimable states as literals (fixed enum values): the claim's
    statement text then never changes with them."""
    column = Operation._meta.get_field("state").column
    states = ", ".join(f"'{state.value}'" for state in sorted(CLAIMABLE))  # fixed enum values
    return f'"{column}" IN ({states})'


def _claim_sql(*, alias: str, by_path: bool, by_servers: bool) -> str:
    """The claim as one statement: lock, lease and return the batch (no second lookup of ids).

    Spelled out once per connection alias and shape, not compiled by the ORM on every pass (the
    dispatcher claims several times a second).

    Candidates come from the due index (ledger_operationdue, in the order rows became
    claimable: a lapsed lease is due at its end, so it waits behind older rows only and is never
    starved); the lock is taken on the operation row (`FOR UPDATE OF c SKIP LOCKED`), the same
    row every transition locks first, so the lock order is always operation row then due row
    (the trigger's write) and a claim cannot deadlock with a transition. The due condition is
    repeated on the operation row because that is the row PostgreSQL re-reads when the row it
    locks was changed by a transaction that committed after the claim's snapshot: a row
    rescheduled meanwhile is judged by its new times, not by the due entry the snapshot saw.

    The UPDATE writes only columns no index of the operation row holds, so on a page with room
    it is a HOT update. The due entries of the claimed rows move to the lease's end in the same
    statement, set-based (the `moved` CTE: one UPDATE for the batch), instead of through the
    row trigger's per-row call, which the trigger skips for this write alone: the candidates'
    filter announces the claim's owner, a fresh token, in the transaction-local setting
    `toolops.claim_owner`, and the trigger skips a write only when it sets the row's lease owner
    to that value (migration 0018_claim_writes_its_due_rows). The setting is set before any row
    is written: both writes read the locked batch whole before they start. Lock order is
    unchanged: operation row, then its due row.

    The state check is spelled `(...) IS TRUE` so that no index can serve it: candidates are
    found by the due index alone. On a ledger not yet analyzed the planner estimated the small
    index on `state` at a few rows and chose it, reading every open row and sorting them for
    each claim.

    Parameters: owner, horizon (the due entry), [path], [server ids], now (the lease), horizon
    (the next poll time), batch size, owner, lease end (three times: lease, next poll time, due
    entry); the horizon is now unless the claim reaches ahead. Returns the claimed ids with their
    due times, in the order they became due."""
    return statement_spelled(site="claim", shape=(alias, by_path, by_servers),
                             spell=lambda: _claim_spelled(by_path=by_path, by_servers=by_servers))


def _claim_spelled(*, by_path: bool, by_servers: bool) -> str:
    meta = Operation._meta
    table = meta.db_table
    due_table = OperationDue._meta.db_table

    def col(name: str) -> str:
        return f'"{cast("Field[Any, Any]", meta.get_field(name)).column}"'

    clauses, _params = _due_scope(path="" if by_path else None,
                                  server_ids=() if by_servers else None, table="d")
    scope = "".join(f" AND {clause}" for clause in clauses)
    pk, lease, due = col("id"), col("lease_expires_at"), col("next_poll_at")
    candidates = (
        f'SELECT c.{pk}, d."due_at" FROM "{due_table}" AS d JOIN "{table}" AS c ON c.{pk} = d."operation_id" '
        # Uncorrelated, so planned as a one-time filter: the setting is set once, before the
        # walk's first row, not once per candidate.
        f"WHERE (SELECT set_config('{CLAIM_OWNER_SETTING}', %s, true)) IS NOT NULL "
        f'AND d."due_at" <= %s{scope} AND (c.{_claimable_states_sql()}) IS TRUE '
        f'AND (c.{lease} IS NULL OR c.{lease} <= %s) AND (c.{due} <= %s OR c.{due} IS NULL) '
        f'ORDER BY d."due_at" LIMIT %s FOR UPDATE OF c SKIP LOCKED')
    # Both writes reach their rows by key (`= ANY` of the locked batch, read once): joined to
    # the batch instead, the planner hashed it and read the whole operation table and the whole
    # due table, dead versions included, whenever it expected more than a few rows.
    ids = f'ANY(ARRAY(SELECT k.{pk} FROM batch AS k))'
    claimed = (f'UPDATE "{table}" AS o SET {col("lease_owner")} = %s, {lease} = %s, {due} = %s, '
               f'{col("poll_attempts")} = o.{col("poll_attempts")} + 1 WHERE o.{pk} = {ids}')
    # The trigger's formula is GREATEST(next poll time, lease end); the claim sets both to the
    # same time, the last parameter.
    moved = f'UPDATE "{due_table}" AS m SET "due_at" = %s WHERE m."operation_id" = {ids}'
    return (f"WITH batch AS MATERIALIZED ({candidates}), claimed AS ({claimed}), "
            f'moved AS ({moved}) SELECT k.{pk}, k."due_at" FROM batch AS k ORDER BY k."due_at"')


def claim_due_locked(*, owner: str, limit: int | None = None, path: str | None = None,
                     server_ids: Collection[int] | None = None) -> list[uuid.UUID]:
    """Claim due rows in the caller's transaction (see operations_claim_due).

    `path` and `server_ids` narrow the claim to one executor path or to some servers (a
    dispatcher that serves only those: a fleet partitioned by tool server, or one shard of the
    simulation).

    A leased row is not due: the claim moves `next_poll_at` to the lease's end, so it becomes due
    again exactly when a worker that died holding it would have lost it, unless the poll writes
    its next time first. Its due entry says so too, so the claim's walk never steps past rows in
    flight, however many there are or however early they are due.
    """
    return [op_id for op_id, _due in claim_due_ahead_locked(
        owner=owner, limit=limit, path=path, server_ids=server_ids, ahead_seconds=0.0)]


def claim_due_ahead_locked(*, owner: str, limit: int | None = None, path: str | None = None,
                           server_ids: Collection[int] | None = None,
                           ahead_seconds: float) -> list[tuple[uuid.UUID, datetime]]:
    """claim_due_locked, also taking the free rows that fall due within `ahead_seconds`; returns
    each claimed row with the time it was due (its poll must not come before that time: the
    worker holds a row claimed early until then, toolops.services.poll_batch).

    Only a free row is claimed early. A leased row whose lease has not run out is never claimed,
    however soon it runs out, so claiming ahead never takes a row from a live holder. The lease
    is the usual one, counted from now, so it outlasts the wait by far (the horizon is capped at
    half a lease)."""
    now = timezone.now()
    lease_seconds = float(settings.TOOLOPS_LEASE_SECONDS)
    horizon = now + timedelta(seconds=min(max(ahead_seconds, 0.0), lease_seconds / 2))
    batch = limit or int(settings.TOOLOPS_CLAIM_BATCH)
    lease_until = now + timedelta(seconds=lease_seconds)
    connection = connections[router.db_for_write(Operation)]
    if connection.vendor == "postgresql":
        sql = _claim_sql(alias=connection.alias, by_path=path is not None,
                         by_servers=server_ids is not None)
        _clauses, scope = _due_scope(path=path, server_ids=server_ids)
        with connection.cursor() as cursor:
            cursor.execute(sql, [owner, horizon, *scope, now, horizon, batch, owner, lease_until,
                                 lease_until, lease_until])
            # The batch comes back in the order its rows became due (the statement's ORDER BY),
            # so the oldest are polled first.
            return [(row[0], row[1]) for row in cursor.fetchall()]
    # Elsewhere (SQLite, the embedded default: one writer at a time, so no row lock to skip):
    # the same walk over the due index, then the same write.
    due = _due_entries(path=path, server_ids=server_ids).filter(due_at__lte=horizon)
    candidates = list(due.order_by("due_at").values_list("operation_id", "due_at")[:batch])
    rows = Operation.objects.select_for_update(skip_locked=True).filter(
        claimable_now(now=now, horizon=horizon), id__in=[op_id for op_id, _due in candidates])
    claimed = set(rows.values_list("id", flat=True))
    picked = [(op_id, at) for op_id, at in candidates if op_id in claimed]
    if picked:
        Operation.objects.filter(id__in=[op_id for op_id, _at in picked]).update(
            **schedule_leased(owner=owner, until=lease_until), poll_attempts=F("poll_attempts") + 1,
        )
    return picked


@contextmanager
def _claim_transaction() -> Iterator[None]:
    """The claim's transaction. A claim lost in a database crash only leaves its rows to be
    claimed again: every later write re-checks the lease in SQL, and a request the claim led to
    is one a second claimer may repeat anyway once a lease runs out (a read, a cancel whose
    request was recorded first, a lookup or resend under the same key). So where this block owns
    its transaction, the commit does not wait for the WAL flush (ledger/flush.py)."""
    connection = connections[router.db_for_write(Operation)]
    deferred = bool(settings.TOOLOPS_DEFERRED_FLUSH) and flush_deferrable(connection=connection)
    with transaction.atomic(using=connection.alias):
        if deferred:
            transaction_flush_deferred(using=connection.alias)
        yield


def operations_claim_due(*, owner: str, limit: int | None = None,
                         server_ids: Collection[int] | None = None) -> list[uuid.UUID]:
    """One transaction: lock due, unleased rows (`FOR UPDATE SKIP LOCKED`), lease them."""
    with _claim_transaction():
        return claim_due_locked(owner=owner, limit=limit, server_ids=server_ids)


def operations_dispatch_due(*, enqueue: Callable[[uuid.UUID, str], None], room: int | None = None) -> int:
    """Claim due rows and hand each to `enqueue` only once the claim has committed.

    `room`: how many more messages the workers' queue should take now (None: no limit but the
    claim batch). Rows left unclaimed stay due in the ledger for the next tick.
    """
    if room is not None and room <= 0:
        return 0
    batch = int(settings.TOOLOPS_CLAIM_BATCH)
    owner = f"lease-{uuid.uuid4().hex}"
    with _claim_transaction():
        ids = claim_due_locked(owner=owner, limit=batch if room is None else min(room, batch))
        for op_id in ids:
            # Never enqueue inside the transaction: a rolled-back claim must send nothing.
            transaction.on_commit(partial(enqueue, op_id, owner))
    return len(ids)


@dataclass(frozen=True)
class DispatchPass:
    claimed: int
    # When the next row becomes claimable, read in the claim's transaction (no commit of its
    # own); None when nothing is scheduled or the pass did not reach the database.
    next_due_at: datetime | None = None
    read_next_due: bool = False
    # The fleet was behind (poll messages waiting, or the machine saturated).
    behind: bool = False


# What a batch's enqueue callback gets: the rows, their lease owner, and the rows claimed before
# their time with the time each falls due (empty when all were due at the claim); while the
# fleet is behind, every row with the time it fell due.
EnqueueBatch = Callable[[list[uuid.UUID], str, dict[uuid.UUID, datetime]], None]


def operations_dispatch_due_batches(
    *, enqueue_batch: EnqueueBatch, room: int | None = None, batch_size: int | None = None,
    ahead_seconds: float | None = None,
) -> DispatchPass:
    """Like operations_dispatch_due, but the claimed rows go out in batches of `batch_size`
    (default TOOLOPS_POLL_BATCH_SIZE): one message per batch, polled together by one worker
    (toolops.services.poll_batch). `room` counts rows, not messages.

    While no poll message waits in the broker (`room` is the whole TOOLOPS_DISPATCH_MAX_QUEUED,
    or unknown) and the machine has CPU to spare, the claim also takes the free rows falling due
    within `ahead_seconds` (default TOOLOPS_DISPATCH_AHEAD_SECONDS), and tells the worker when
    each is due, so rows due close together share one claim and one message, none polled early.
    Otherwise the fleet is behind, and each row goes with the time it fell due.

    The same transaction also reads when the next row falls due, for a dispatcher that sleeps
    until then (operations_dispatch_following_due) without a commit of its own per wake."""
    if room is not None and room <= 0:
        return DispatchPass(claimed=0)
    size = max(int(batch_size or settings.TOOLOPS_POLL_BATCH_SIZE), 1)
    claim = int(settings.TOOLOPS_CLAIM_BATCH)
    ahead = float(settings.TOOLOPS_DISPATCH_AHEAD_SECONDS if ahead_seconds is None
                  else ahead_seconds)
    # Poll messages wait in the broker, or the machine is saturated: the fleet is behind. A row
    # claimed early would be polled on time, and a row polled a little late is more often found
    # finished (one poll instead of two): in toolops-only bursts of 5,000, claiming ahead
    # regardless made 1.41 to 1.57 polls per call instead of 1.24 to 1.43, and raised the p99
    # from about 1.9 s to 2.2 to 3.6 s. Behind, every row's due time goes with its batch, so
    # the worker may put a first poll off (TOOLOPS_POLL_DEFER_FIRST_WHEN_BUSY).
    behind = ((room is not None and room < int(settings.TOOLOPS_DISPATCH_MAX_QUEUED))
              or not machine_cpu_to_spare())
    if behind:
        ahead = 0.0
    owner = f"lease-{uuid.uuid4().hex}"
    with _claim_transaction():
        rows = claim_due_ahead_locked(owner=owner, limit=claim if room is None else min(room, claim),
                                      ahead_seconds=ahead)
        now = timezone.now()
        for start in range(0, len(rows), size):
            part = rows[start:start + size]
            early = dict(part) if behind else {op_id: due for op_id, due in part if due > now}
            # Never enqueue inside the transaction: a rolled-back claim must send nothing.
            transaction.on_commit(partial(enqueue_batch, [op_id for op_id, _due in part], owner,
                                          early))
        next_due = operations_next_due_at()
    return DispatchPass(claimed=len(rows), next_due_at=next_due, read_next_due=True,
                        behind=behind)


# After a pass that claimed nothing although a row was due (the poll queue is full), wait at
# least this long before the next pass, so a full queue is not met with a busy loop of claims.
DISPATCH_FULL_NAP_SECONDS = 0.05


def operations_dispatch_following_due(*, seconds: float,
                                      dispatch_once: Callable[[], DispatchPass]) -> int:
    """Run `dispatch_once` now and then again whenever the next row becomes claimable, for
    `seconds` (one dispatcher tick). A row due between two ticks is claimed at its time instead
    of waiting up to a whole tick. Passes are at least TOOLOPS_DISPATCH_MIN_GAP_SECONDS apart,
    so rows falling due close together share one claim (one commit) and one batch; after a pass
    that found the fleet behind, TOOLOPS_DISPATCH_BUSY_GAP_SECONDS."""
    end = time.monotonic() + seconds
    total = 0
    while True:
        started = time.monotonic()
        done = dispatch_once()
        gap = float(settings.TOOLOPS_DISPATCH_BUSY_GAP_SECONDS if done.behind
                    else settings.TOOLOPS_DISPATCH_MIN_GAP_SECONDS)
        total += done.claimed
        left = end - time.monotonic()
        if left <= 0:
            return total
        if not done.read_next_due or (done.claimed == 0 and done.next_due_at is not None
                                      and done.next_due_at <= timezone.now()):
            wait = DISPATCH_FULL_NAP_SECONDS
        elif done.next_due_at is None:
            return total  # nothing scheduled: the next tick looks again
        else:
            wait = (done.next_due_at - timezone.now()).total_seconds()
        wait = max(wait, gap - (time.monotonic() - started))
        if wait >= left:
            return total  # nothing due before the tick ends: the next tick's first pass takes it
        time.sleep(max(wait, 0.0))


def operations_next_due_at(*, server_ids: Collection[int] | None = None) -> datetime | None:
    """When the earliest claimable row (of these servers) becomes claimable (None when nothing
    is scheduled)."""
    return next_claimable_at(server_ids=server_ids)


def ledger_statistics_refresh() -> list[str]:
    """The dispatcher's refresh of the ledger's planner statistics, with the configured thresholds
    (ledger/services/statistics.py): every loop that claims rows runs it on its tick, so plans
    cached while the ledger was nearly empty are made again once it has grown."""
    return ledger_statistics_refresh_grown(
        growth=float(settings.TOOLOPS_STATS_REFRESH_GROWTH),
        min_rows=int(settings.TOOLOPS_STATS_REFRESH_MIN_ROWS),
        min_interval_s=float(settings.TOOLOPS_STATS_REFRESH_INTERVAL_SECONDS))
