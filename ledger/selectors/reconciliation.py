"""Reads of the manual reconciliation queue (the admin list, the CLI and the gate use these)."""

from __future__ import annotations

from datetime import datetime

from django.db.models import QuerySet
from django.utils import timezone

from ledger.models import ReconciliationItem


def reconciliation_items_open(*, overdue_only: bool = False,
                              now: datetime | None = None) -> QuerySet[ReconciliationItem]:
    items = ReconciliationItem.objects.filter(status=ReconciliationItem.Status.OPEN)
    if overdue_only:
        items = items.filter(deadline__lt=now or timezone.now())
    return items.select_related("operation", "owner").order_by("created_at")


def reconciliation_oldest_open_age_seconds(*, now: datetime | None = None) -> float | None:
    """Gate figure: age of the oldest open item (None when the queue is empty)."""
    oldest = (
        ReconciliationItem.objects.filter(status=ReconciliationItem.Status.OPEN)
        .order_by("created_at").values_list("created_at", flat=True).first()
    )
    if oldest is None:
        return None
    return ((now or timezone.now()) - oldest).total_seconds()


def reconciliation_overdue_count(*, now: datetime | None = None) -> int:
    """Gate figure: open items past their deadline (must be zero)."""
    return reconciliation_items_open(overdue_only=True, now=now).count()
