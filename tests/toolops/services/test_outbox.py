"""The outbox relay: skip-locked claims, delivery with the receipt id as idempotency key, backoff."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from ledger.models import OutboxEvent
from tests.toolops.outbox_helpers import accepted_operation
from toolops import api
from toolops.services.outbox import _mark_published, outbox_claim, outbox_event_ready, outbox_relay

pytestmark = pytest.mark.django_db


class Recorder:
    def __init__(self, fail_times: int = 0, delay: float = 0.0) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.fail_times = fail_times
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, *, event: dict[str, Any], idempotency_key: str) -> None:
        if self.delay:
            time.sleep(self.delay)
        with self.lock:
            if self.fail_times > 0:
                self.fail_times -= 1
                raise ConnectionError("downstream unavailable")
            self.calls.append((idempotency_key, event))


def test_relay_delivers_each_event_once_with_the_receipt_id_as_key() -> None:
    pairs = [accepted_operation() for _ in range(3)]
    handler = Recorder()
    stats = api.consume_outbox(handler=handler)
    assert (stats.claimed, stats.published, stats.failed) == (3, 3, 0)
    by_key = {key: event for key, event in handler.calls}
    for op, receipt in pairs:
        event = by_key[str(receipt.pk)]
        # Traceability: the event names its receipt, the receipt names its operation.
        assert event["receipt_id"] == receipt.pk
        assert event["operation_id"] == str(op.id) == str(receipt.operation_id)
        assert event["call_node_id"] == op.call_node_id
        assert event["terminal_status"] == "completed"
    assert OutboxEvent.objects.filter(published_at__isnull=True).count() == 0
    assert outbox_relay(handler=handler).claimed == 0
    assert len(handler.calls) == 3


def test_failed_delivery_is_retried_after_backoff_not_dropped() -> None:
    _op, receipt = accepted_operation()
    handler = Recorder(fail_times=2)
    with override_settings(TOOLOPS_OUTBOX_BACKOFF_BASE_SECONDS=30.0):
        first = outbox_relay(handler=handler)
        assert (first.failed, first.published) == (1, 0)
        row = OutboxEvent.objects.get(receipt=receipt)
        assert row.published_at is None and row.attempts == 1
        assert "ConnectionError: downstream unavailable" in row.last_error
        # Backoff: base * 2**0 = 30 s ahead; a relay pass now does not touch the row.
        assert row.available_at is not None
        assert timedelta(seconds=25) < row.available_at - timezone.now() <= timedelta(seconds=30)
        assert outbox_relay(handler=handler).claimed == 0
        OutboxEvent.objects.filter(pk=row.pk).update(available_at=timezone.now())
        assert outbox_relay(handler=handler).failed == 1
        row.refresh_from_db()
        # Second failure: 30 * 2**1 = 60 s.
        assert timedelta(seconds=55) < row.available_at - timezone.now() <= timedelta(seconds=60)
        OutboxEvent.objects.filter(pk=row.pk).update(available_at=timezone.now())
        assert outbox_relay(handler=handler).published == 1
    row.refresh_from_db()
    assert row.published_at is not None and row.attempts == 3 and row.last_error == ""
    assert [key for key, _ in handler.calls] == [str(receipt.pk)]


def test_a_relay_whose_lease_was_taken_over_does_not_mark_the_row() -> None:
    _op, receipt = accepted_operation()
    (slow,) = outbox_claim(owner="relay-slow", limit=10)
    # The slow relay's lease runs out; another relay claims and delivers.
    OutboxEvent.objects.filter(pk=slow.pk).update(available_at=timezone.now() - timedelta(seconds=1))
    handler = Recorder()
    assert outbox_relay(handler=handler).published == 1
    assert _mark_published(row=slow, owner="relay-slow") is False
    row = OutboxEvent.objects.get(pk=slow.pk)
    assert row.attempts == 1
    # Had the slow relay's handler succeeded too, it would have carried the same key.
    assert handler.calls[0][0] == str(receipt.pk)


def test_default_handler_is_a_django_signal() -> None:
    _op, receipt = accepted_operation()
    received: list[tuple[str, int]] = []

    def receiver(sender: object, *, event: dict[str, Any], idempotency_key: str, **_: Any) -> None:
        received.append((idempotency_key, event["receipt_id"]))

    outbox_event_ready.connect(receiver)
    try:
        assert outbox_relay().published == 1
    finally:
        outbox_event_ready.disconnect(receiver)
    assert received == [(str(receipt.pk), receipt.pk)]


def test_handler_by_dotted_path_from_settings() -> None:
    accepted_operation()
    with override_settings(TOOLOPS_OUTBOX_HANDLER="tests.toolops.services.test_outbox.always_fails"):
        stats = outbox_relay()
    assert stats.failed == 1 and stats.published == 0


def always_fails(*, event: dict[str, Any], idempotency_key: str) -> None:
    raise RuntimeError("configured handler ran")


@pytest.mark.django_db(transaction=True)
def test_concurrent_relays_never_deliver_one_event_twice() -> None:
    receipts = {str(accepted_operation()[1].pk) for _ in range(30)}
    handler = Recorder(delay=0.01)
    errors: list[BaseException] = []

    def relay() -> None:
        try:
            while outbox_relay(handler=handler, limit=4).claimed:
                pass
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=relay) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    keys = [key for key, _ in handler.calls]
    assert sorted(keys) == sorted(receipts)  # every event once, none twice
    assert OutboxEvent.objects.filter(published_at__isnull=True).count() == 0


def test_management_command_runs_one_relay_pass() -> None:
    import io
    import json as jsonlib

    from django.core.management import call_command

    accepted_operation()
    accepted_operation()
    out = io.StringIO()
    call_command("toolops_outbox", "--handler", "tests.toolops.services.test_outbox.always_fails", stdout=out)
    assert jsonlib.loads(out.getvalue())["failed"] == 2
    out = io.StringIO()
    call_command("toolops_outbox", stdout=out)  # default handler (signal) after the backoff:
    assert jsonlib.loads(out.getvalue())["claimed"] == 0  # both rows are still backing off
    assert OutboxEvent.objects.filter(published_at__isnull=True, attempts=1).count() == 2
