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
from typing import Any

from django.conf import settings
from django.db import connections, router, transaction
from django.db.models import F, Q
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


def _branches(queryset: Any) -> tuple[Any, Any]:
    scoped = queryset.filter(state__in=CLAIMABLE)
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
    rows = Operation.objects.select_for_update(skip_locked=True)
    if path is not None:
        rows = rows.filter(executor_path=path)
    if server_ids is not None:
        rows = rows.filter(server_id__in=list(server_ids))
    connection = connections[router.db_for_write(Operation)]
    if connection.vendor == "postgresql":
        # One statement: lock, lease and return the batch (no second lookup of each id). Lapsed
        # leases first: they are rare (a worker died), the walk over them stops at the first lease
        # still running, and putting them ahead means a steady stream of due rows cannot starve
        # them. Each branch is its own ordered walk over its own partial index; the outer LIMIT
        # stops pulling rows (and so locking them) from the free branch once the batch is full.
        lapsed_sql, lapsed_params = (rows.filter(_claimable_lapsed(now=now))
                                     .order_by("lease_expires_at").values_list("id", flat=True)
                                     [:batch].query.sql_with_params())
        free_sql, free_params = (rows.filter(_claimable_free(now=now)).order_by("next_poll_at")
                                 .values_list("id", flat=True)[:batch].query.sql_with_params())
        table = Operation._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(
                f'UPDATE "{table}" AS o SET "lease_owner" = %s, "lease_expires_at" = %s, '
                f'"next_poll_at" = %s, "poll_attempts" = o."poll_attempts" + 1 '
                f'FROM (SELECT "id" FROM ({lapsed_sql}) AS lapsed '
                f'UNION ALL SELECT "id" FROM ({free_sql}) AS free LIMIT %s) AS due '
                f'WHERE o."id" = due."id" RETURNING o."id"',
                [owner, lease_until, lease_until, *lapsed_params, *free_params, batch],
            )
            return [row[0] for row in cursor.fetchall()]
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
    # Every dispatcher pass asks this, with the same parameters (the claimable states): the
    # statement is compiled once per connection and replayed.
    compiled = _NEXT_DUE_SQL.get(rows.db)
    if compiled is None:
        compiled = _NEXT_DUE_SQL[rows.db] = _next_claimable_sql(rows)
    with connection.cursor() as cursor:
        cursor.execute(*compiled)
        row = cursor.fetchone()
    return None if row is None else row[0]


_NEXT_DUE_SQL: dict[str, tuple[str, list[Any]]] = {}
