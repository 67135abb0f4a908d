"""Claiming due rows: the poll schedule lives in the ledger, never in broker ETAs.

One transaction claims a batch with `SELECT ... FOR UPDATE SKIP LOCKED`, so two dispatchers never
lease the same row: the second skips rows the first has locked and, after the first commits, sees
them leased. A worker that dies holding a lease stalls its rows only until the lease expires:
an expired lease is claimable whatever the row's `next_poll_at` says (a worker may die between
two writes of one cycle, holding a lease on a row with no next poll time), so no open row of a
polled state is ever left without someone to claim it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Min, Q
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from ledger.models import Operation
from ledger.states import POLLABLE, State

# SUBMITTING rows are claimable only after their submitter's lease ran out (see operation_poll).
# SUBMISSION_UNKNOWN rows are claimed for their resolution pass (lookup by submission key).
CLAIMABLE = frozenset(POLLABLE | {State.SUBMITTING, State.SUBMISSION_UNKNOWN})


def claimable_now(*, now: datetime) -> Q:
    """Due and free, or held by a lease that ran out (with or without a next poll time)."""
    return (
        Q(state__in=CLAIMABLE)
        & (Q(next_poll_at__lte=now) | Q(next_poll_at__isnull=True, lease_expires_at__isnull=False))
        & (Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now))
    )


def next_claimable_at(queryset: Any) -> datetime | None:
    """When the earliest row of `queryset` becomes claimable: its next poll time, or its lease's
    end when that is later (a leased row is not ours to poll before then)."""
    return queryset.filter(state__in=CLAIMABLE).filter(
        Q(next_poll_at__isnull=False) | Q(lease_expires_at__isnull=False)
    ).aggregate(m=Min(Greatest(Coalesce("next_poll_at", "lease_expires_at"),
                               Coalesce("lease_expires_at", "next_poll_at"))))["m"]


def operations_claim_due(*, owner: str, limit: int | None = None) -> list[uuid.UUID]:
    now = timezone.now()
    batch = limit or int(settings.TOOLOPS_CLAIM_BATCH)
    lease_until = now + timedelta(seconds=float(settings.TOOLOPS_LEASE_SECONDS))
    with transaction.atomic():
        ids = list(
            Operation.objects.select_for_update(skip_locked=True)
            .filter(claimable_now(now=now))
            .order_by("next_poll_at")
            .values_list("id", flat=True)[:batch]
        )
        if ids:
            Operation.objects.filter(id__in=ids).update(
                lease_owner=owner, lease_expires_at=lease_until,
                poll_attempts=F("poll_attempts") + 1,
            )
    return ids


def operations_dispatch_due(*, enqueue: Callable[[uuid.UUID, str], None]) -> int:
    """Claim due rows and hand each to `enqueue` only once the claim has committed."""
    owner = f"lease-{uuid.uuid4().hex}"
    with transaction.atomic():
        ids = operations_claim_due(owner=owner)
        for op_id in ids:
            # Never enqueue inside the transaction: a rolled-back claim must send nothing.
            transaction.on_commit(partial(enqueue, op_id, owner))
    return len(ids)


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
        .update(next_poll_at=now)
    )


def operations_next_due_at() -> datetime | None:
    """When the earliest claimable row becomes claimable (None when nothing is scheduled)."""
    return next_claimable_at(Operation.objects.all())
