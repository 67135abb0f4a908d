"""Claiming due rows: the poll schedule lives in the ledger, never in broker ETAs.

One transaction claims a batch with `SELECT ... FOR UPDATE SKIP LOCKED`, so two dispatchers never
lease the same row: the second skips rows the first has locked and, after the first commits, sees
them leased. A worker that dies holding a lease stalls its rows only until the lease expires.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, cast

from django.conf import settings
from django.db import connections, router, transaction
from django.db.models import BooleanField, F, Field, Q
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from ledger.models import Operation
from ledger.services.schedule import schedule_at, schedule_leased
from ledger.states import POLLABLE, State

# SUBMITTING rows are claimable only after their submitter's lease ran out (see operation_poll).
# SUBMISSION_UNKNOWN rows are claimed for their resolution pass (lookup by submission key).
CLAIMABLE = frozenset(POLLABLE | {State.SUBMITTING, State.SUBMISSION_UNKNOWN})


def _claimable_free(*, now: datetime) -> Q:
    """Due and not leased: the common branch, walked in due order on op_due_free_idx."""
    return Q(state__in=CLAIMABLE, lease_expires_at__isnull=True, next_poll_at__lte=now)


def _claimable_lapsed(*, now: datetime) -> Q:
    """Held by a lease that ran out, due or with no next poll time (op_leased_idx).

    A claim moves `next_poll_at` to the lease's end, so a lapsed lease is normally due by its
    next poll time too; a row whose writer cleared the schedule while it held the lease has no
    next poll time at all and is still claimed here, so no row can be stranded by a worker that
    died between that write and the next."""
    return Q(state__in=CLAIMABLE, lease_expires_at__lte=now) & (
        Q(next_poll_at__lte=now) | Q(next_poll_at__isnull=True)
    )


def claimable_now(*, now: datetime) -> Q:
    """Due and free, or held by a lease that ran out (with or without a next poll time).

    The two branches are disjoint (a lease is either absent or set) and each has a partial index
    whose predicate is its own; a leased row whose lease has not run out is in neither, however
    early its next poll time."""
    return _claimable_free(now=now) | _claimable_lapsed(now=now)


def next_claimable_at(queryset: Any) -> datetime | None:
    """When the earliest row of `queryset` becomes claimable: its next poll time, or its lease's
    end when that is later (a leased row is not ours to poll before then).

    One read per branch, so each is answered from its partial index (the free branch by the
    index's first entry, the leased one over leased rows only) instead of an aggregate over every
    open row; on PostgreSQL both are one statement (LEAST skips a branch that has no row)."""
    connection = connections[queryset.db]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(*_next_claimable_sql(queryset))
            row = cursor.fetchone()
        return None if row is None else row[0]
    free, leased = _branches(queryset)
    return min([*free, *leased], default=None)


def _claimable_states_sql() -> str:
    """`state IN (...)` with the claimable states as literals, never parameters: a prepared
    statement's generic plan can use a partial index only when the statement's own predicate
    proves the index's, which `state IN ($1, ...)` cannot (it would walk the whole table)."""
    column = Operation._meta.get_field("state").column
    states = ", ".join(f"'{state.value}'" for state in sorted(CLAIMABLE))  # fixed enum values
    return f'"{column}" IN ({states})'


def _branches(queryset: Any) -> tuple[Any, Any]:
    scoped = queryset.filter(RawSQL(_claimable_states_sql(), [], output_field=BooleanField()))
    free = (scoped.filter(lease_expires_at__isnull=True, next_poll_at__isnull=False)
            .order_by("next_poll_at").values_list("next_poll_at", flat=True)[:1])
    leased = (scoped.filter(lease_expires_at__isnull=False)
              .annotate(at=Greatest("lease_expires_at", Coalesce("next_poll_at", "lease_expires_at")))
              .order_by("at").values_list("at", flat=True)[:1])
    return free, leased


def _next_claimable_sql(queryset: Any) -> tuple[str, list[Any]]:
    """The PostgreSQL statement of next_claimable_at: both branches in one LEAST."""
    free, leased = _branches(queryset)
    free_sql, free_params = free.query.sql_with_params()
    leased_sql, leased_params = leased.query.sql_with_params()
    return f"SELECT LEAST(({free_sql}), ({leased_sql}))", [*free_params, *leased_params]


_CLAIM_SQL: dict[tuple[str, bool, bool], str] = {}


def _claim_sql(*, alias: str, by_path: bool, by_servers: bool) -> str:
    """The claim as one statement: lock, lease and return the batch (no second lookup of ids).

    Spelled out once per connection alias and shape, not compiled by the ORM on every pass (the
    dispatcher claims several times a second). The claimable states are literals, never
    parameters: a prepared statement's generic plan can use a partial index only when the query's
    own predicate proves the index's (_claimable_states_sql).

    Lapsed leases first: they are rare (a worker died), the walk over them stops at the first
    lease still running, and putting them ahead means a steady stream of due rows cannot starve
    them. Each branch is its own ordered walk over its own partial index (op_leased_idx,
    op_due_free_idx, whose predicates these WHERE clauses repeat); the outer LIMIT stops pulling
    rows (and so locking them) from the free branch once the batch is full.

    Parameters: owner, lease end (twice: lease and next poll time), now twice, [path],
    [server ids], batch; now, [path], [server ids], batch; batch."""
    key = (alias, by_path, by_servers)
    cached = _CLAIM_SQL.get(key)
    if cached is not None:
        return cached
    meta = Operation._meta
    table = meta.db_table

    def col(name: str) -> str:
        return f'"{cast("Field[Any, Any]", meta.get_field(name)).column}"'

    states = _claimable_states_sql()
    scope = ""
    if by_path:
        scope += f" AND {col('executor_path')} = %s"
    if by_servers:
        scope += f" AND {col('server')} = ANY(%s)"
    pk, lease, due = col("id"), col("lease_expires_at"), col("next_poll_at")
    lapsed = (f'SELECT {pk} FROM "{table}" WHERE {states} AND {lease} <= %s '
              f'AND ({due} <= %s OR {due} IS NULL){scope} ORDER BY {lease} LIMIT %s '
              f'FOR UPDATE SKIP LOCKED')
    free = (f'SELECT {pk} FROM "{table}" WHERE {states} AND {lease} IS NULL '
            f'AND {due} <= %s{scope} ORDER BY {due} LIMIT %s FOR UPDATE SKIP LOCKED')
    sql = (f'UPDATE "{table}" AS o SET {col("lease_owner")} = %s, {lease} = %s, {due} = %s, '
           f'{col("poll_attempts")} = o.{col("poll_attempts")} + 1 '
           f'FROM (SELECT {pk} FROM ({lapsed}) AS lapsed '
           f'UNION ALL SELECT {pk} FROM ({free}) AS free LIMIT %s) AS due '
           f'WHERE o.{pk} = due.{pk} RETURNING o.{pk}')
    _CLAIM_SQL[key] = sql
    return sql


def claim_due_locked(*, owner: str, limit: int | None = None, path: str | None = None,
                     server_ids: Collection[int] | None = None) -> list[uuid.UUID]:
    """Claim due rows in the caller's transaction (see operations_claim_due).

    `path` and `server_ids` narrow the claim to one executor path or to some servers (a
    dispatcher that serves only those: a fleet partitioned by tool server, or one shard of the
    simulation).

    A leased row is not due: the claim moves `next_poll_at` to the lease's end, so it becomes due
    again exactly when a worker that died holding it would have lost it, unless the poll writes
    its next time first. Neither branch's index holds a row whose lease is still running, so the
    claim never walks past rows in flight, however many there are or however early they are due.
    """
    now = timezone.now()
    batch = limit or int(settings.TOOLOPS_CLAIM_BATCH)
    lease_until = now + timedelta(seconds=float(settings.TOOLOPS_LEASE_SECONDS))
    connection = connections[router.db_for_write(Operation)]
    if connection.vendor == "postgresql":
        sql = _claim_sql(alias=connection.alias, by_path=path is not None,
                         by_servers=server_ids is not None)
        scope: list[Any] = []
        if path is not None:
            scope.append(path)
        if server_ids is not None:
            scope.append(list(server_ids))
        with connection.cursor() as cursor:
            cursor.execute(sql, [owner, lease_until, lease_until, now, now, *scope, batch,
                                 now, *scope, batch, batch])
            return [row[0] for row in cursor.fetchall()]
    rows = Operation.objects.select_for_update(skip_locked=True)
    if path is not None:
        rows = rows.filter(executor_path=path)
    if server_ids is not None:
        rows = rows.filter(server_id__in=list(server_ids))
    ids = list(rows.filter(claimable_now(now=now)).order_by("next_poll_at")
               .values_list("id", flat=True)[:batch])
    if ids:
        Operation.objects.filter(id__in=ids).update(
            **schedule_leased(owner=owner, until=lease_until), poll_attempts=F("poll_attempts") + 1,
        )
    return ids


def operations_claim_due(*, owner: str, limit: int | None = None,
                         server_ids: Collection[int] | None = None) -> list[uuid.UUID]:
    """One transaction: lock due, unleased rows (`FOR UPDATE SKIP LOCKED`), lease them."""
    with transaction.atomic():
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
    with transaction.atomic():
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


def operations_dispatch_due_batches(
    *, enqueue_batch: Callable[[list[uuid.UUID], str], None], room: int | None = None,
    batch_size: int | None = None,
) -> DispatchPass:
    """Like operations_dispatch_due, but the claimed rows go out in batches of `batch_size`
    (default TOOLOPS_POLL_BATCH_SIZE): one message per batch, polled together by one worker
    (toolops.services.poll_batch). `room` counts rows, not messages.

    The same transaction also reads when the next row falls due, for a dispatcher that sleeps
    until then (operations_dispatch_following_due) without a commit of its own per wake."""
    if room is not None and room <= 0:
        return DispatchPass(claimed=0)
    size = max(int(batch_size or settings.TOOLOPS_POLL_BATCH_SIZE), 1)
    claim = int(settings.TOOLOPS_CLAIM_BATCH)
    owner = f"lease-{uuid.uuid4().hex}"
    with transaction.atomic():
        ids = claim_due_locked(owner=owner, limit=claim if room is None else min(room, claim))
        for start in range(0, len(ids), size):
            # Never enqueue inside the transaction: a rolled-back claim must send nothing.
            transaction.on_commit(partial(enqueue_batch, ids[start:start + size], owner))
        next_due = operations_next_due_at()
    return DispatchPass(claimed=len(ids), next_due_at=next_due, read_next_due=True)


# After a pass that claimed nothing although a row was due (the poll queue is full), wait at
# least this long before the next pass, so a full queue is not met with a busy loop of claims.
DISPATCH_FULL_NAP_SECONDS = 0.05


def operations_dispatch_following_due(*, seconds: float,
                                      dispatch_once: Callable[[], DispatchPass]) -> int:
    """Run `dispatch_once` now and then again whenever the next row becomes claimable, for
    `seconds` (one dispatcher tick). A row due between two ticks is claimed at its time instead
    of waiting up to a whole tick. Passes are at least TOOLOPS_DISPATCH_MIN_GAP_SECONDS apart,
    so rows falling due close together share one claim (one commit) and one batch."""
    end = time.monotonic() + seconds
    gap = float(settings.TOOLOPS_DISPATCH_MIN_GAP_SECONDS)
    total = 0
    while True:
        started = time.monotonic()
        done = dispatch_once()
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


def operations_poll_sooner(*, server_id: int, remote_ids: list[str]) -> int:
    """A pushed status (`notifications/tasks/status`) makes its rows due now; nothing else.

    The push is a hint, never a fact: no state or server status is written from it, only the
    schedule, and the poll it triggers still takes a QPS token and goes through the same guards.
    Leased rows are left alone (their poll is in flight), and so is INPUT_REQUIRED (it resumes
    when its input is answered, not when the server talks).
    """
    if not remote_ids:
        return 0
    now = timezone.now()
    return (
        Operation.objects.filter(server_id=server_id, remote_id__in=remote_ids,
                                 state__in=POLLABLE, next_poll_at__gt=now)
        .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now))
        .update(**schedule_at(at=now, release=False))
    )


def operations_next_due_at(*, server_ids: Collection[int] | None = None) -> datetime | None:
    """When the earliest claimable row (of these servers) becomes claimable (None when nothing
    is scheduled)."""
    rows = Operation.objects.all()
    if server_ids is not None:
        return next_claimable_at(rows.filter(server_id__in=list(server_ids)))
    connection = connections[rows.db]
    if connection.vendor != "postgresql":
        return next_claimable_at(rows)
    # Every dispatcher pass asks this, always the same statement (no parameters): compiled once
    # per connection alias and replayed.
    compiled = _NEXT_DUE_SQL.get(rows.db)
    if compiled is None:
        compiled = _NEXT_DUE_SQL[rows.db] = _next_claimable_sql(rows)
    with connection.cursor() as cursor:
        cursor.execute(*compiled)
        row = cursor.fetchone()
    return None if row is None else row[0]


_NEXT_DUE_SQL: dict[str, tuple[str, list[Any]]] = {}
