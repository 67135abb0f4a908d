"""The outbox relay: the only path by which downstream code learns of an accepted terminal state.

Delivery protocol (at-least-once transport, exactly-once effect):

1. Claim: a short transaction selects due, unpublished rows with `FOR UPDATE SKIP LOCKED` (so
   concurrent relays never wait on, or take, each other's rows) and pushes each row's
   `available_at` one lease ahead under a fresh claim token. It commits before any handler runs:
   nothing leaves a transaction.
2. Deliver: the configured handler (dotted path) is called outside any transaction with the event
   and `idempotency_key` = the receipt id. The receipt id is the identity of the advance: a
   redelivery (a relay died after the handler succeeded, or a lease ran out mid-call) carries the
   same key, so the handler applies it once.
3. Mark: `published_at` is set by a conditional UPDATE on (id, claim token, unpublished). A relay
   whose lease was taken over updates nothing and reports it.
   On a handler error the row gets `attempts + 1`, the error text and `available_at` one
   exponential backoff ahead, and stays unpublished.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.dispatch import Signal
from django.utils import timezone
from django.utils.module_loading import import_string

from ledger.models import OutboxEvent
from toolops.logging import get_logger
from toolops.metrics import outbox_delivery_inc

logger = get_logger("toolops.outbox")

OutboxHandler = Callable[..., Any]

# Sent by the default handler; receivers get `event` (dict) and `idempotency_key` (str).
outbox_event_ready = Signal()

# An error text stored on the row is cut here (a traceback is for logs, not the ledger).
MAX_ERROR_CHARS = 500


@dataclass
class RelayStats:
    claimed: int = 0
    published: int = 0
    failed: int = 0
    lost_claim: int = 0
    errors: list[str] = field(default_factory=list)


def outbox_handler_signal(*, event: dict[str, Any], idempotency_key: str) -> None:
    """Default handler: a Django signal. A receiver that raises fails the delivery (it is retried)."""
    outbox_event_ready.send(sender=OutboxEvent, event=event, idempotency_key=idempotency_key)


def outbox_event_message(*, row: OutboxEvent) -> dict[str, Any]:
    """The event as handed to handlers: the stored payload plus its receipt and topic."""
    return {**row.payload, "outbox_id": row.pk, "receipt_id": row.receipt_id, "topic": row.topic}


def _backoff(*, attempts: int) -> timedelta:
    base = float(settings.TOOLOPS_OUTBOX_BACKOFF_BASE_SECONDS)
    cap = float(settings.TOOLOPS_OUTBOX_BACKOFF_MAX_SECONDS)
    return timedelta(seconds=min(base * (2 ** min(attempts, 20)), cap))


def outbox_claim(*, owner: str, limit: int) -> list[OutboxEvent]:
    """Claim up to `limit` due rows for `owner` (see the module docstring, step 1)."""
    now = timezone.now()
    lease = timedelta(seconds=float(settings.TOOLOPS_OUTBOX_LEASE_SECONDS))
    with transaction.atomic(durable=True):
        rows = list(
            OutboxEvent.objects.select_for_update(skip_locked=True)
            .filter(Q(available_at__isnull=True) | Q(available_at__lte=now), published_at__isnull=True)
            .order_by("created_at", "id")[:limit]
        )
        if rows:
            OutboxEvent.objects.filter(id__in=[r.pk for r in rows]).update(
                available_at=now + lease, claimed_by=owner
            )
    for r in rows:
        r.claimed_by = owner
    return rows


def _mark_published(*, row: OutboxEvent, owner: str) -> bool:
    return bool(
        OutboxEvent.objects.filter(id=row.pk, claimed_by=owner, published_at__isnull=True).update(
            published_at=timezone.now(), attempts=F("attempts") + 1, last_error="", claimed_by=""
        )
    )


def _mark_failed(*, row: OutboxEvent, owner: str, error: str) -> None:
    OutboxEvent.objects.filter(id=row.pk, claimed_by=owner, published_at__isnull=True).update(
        attempts=F("attempts") + 1,
        last_error=error[:MAX_ERROR_CHARS],
        available_at=timezone.now() + _backoff(attempts=row.attempts),
        claimed_by="",
    )


def outbox_relay(*, handler: OutboxHandler | str | None = None, limit: int | None = None) -> RelayStats:
    """One relay pass: claim due rows, deliver each, mark it. Safe to run in many processes."""
    if handler is None:
        handler = str(settings.TOOLOPS_OUTBOX_HANDLER)
    fn: OutboxHandler = import_string(handler) if isinstance(handler, str) else handler
    owner = f"relay-{uuid.uuid4().hex[:12]}"
    stats = RelayStats()
    rows = outbox_claim(owner=owner, limit=int(limit or settings.TOOLOPS_OUTBOX_BATCH))
    stats.claimed = len(rows)
    for row in rows:
        event = outbox_event_message(row=row)
        try:
            fn(event=event, idempotency_key=str(row.receipt_id))
        except Exception as exc:
            _mark_failed(row=row, owner=owner, error=f"{type(exc).__name__}: {exc}")
            stats.failed += 1
            stats.errors.append(f"{row.receipt_id}: {type(exc).__name__}")
            outbox_delivery_inc(outcome="failed")
            logger.warning("outbox delivery failed", receipt_id=row.receipt_id,
                           operation_id=event.get("operation_id"), error_type=type(exc).__name__)
            continue
        if _mark_published(row=row, owner=owner):
            stats.published += 1
            outbox_delivery_inc(outcome="published")
        else:
            # Our lease ran out and another relay re-claimed the row; it will deliver again under
            # the same idempotency key, which the handler dedups.
            stats.lost_claim += 1
            outbox_delivery_inc(outcome="lost_claim")
    return stats


def outbox_celery_handler(*, event: dict[str, Any], idempotency_key: str) -> None:
    """Alternative handler: enqueue a Celery task by name (TOOLOPS_OUTBOX_CELERY_TASK).

    Called outside any transaction by the relay, so the enqueue never precedes a commit.
    """
    from celery import current_app

    current_app.send_task(str(settings.TOOLOPS_OUTBOX_CELERY_TASK),
                          kwargs={"event": event, "idempotency_key": idempotency_key})
