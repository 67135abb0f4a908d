"""The dispatcher's view of the poll queue: its length in a real Redis broker, and no limit
(never an error, never a hang) when the broker cannot tell."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest
import redis
from django.test import override_settings

from toolops.broker import dispatch_room, poll_queue_length

BROKER = os.environ.get("TOOLOPS_TEST_BROKER_URL", "redis://127.0.0.1:6379/15")


def _app(url: str) -> SimpleNamespace:
    return SimpleNamespace(conf=SimpleNamespace(broker_url=url))


def test_the_length_is_read_from_the_redis_list_and_bounds_the_room() -> None:
    client = redis.Redis.from_url(BROKER)
    client.delete("toolops-test-queue")  # fails (never skips) when Redis is down
    client.rpush("toolops-test-queue", b"a", b"b", b"c")
    try:
        assert poll_queue_length(app=_app(BROKER), queue="toolops-test-queue") == 3
        with override_settings(TOOLOPS_DISPATCH_MAX_QUEUED=100):
            # Three waiting batches of 20 rows take 60 of the 100 rows' room.
            assert dispatch_room(app=_app(BROKER), queue="toolops-test-queue", rows_per_message=20) == 40
        client.lpop("toolops-test-queue")
        assert poll_queue_length(app=_app(BROKER), queue="toolops-test-queue") == 2
    finally:
        client.delete("toolops-test-queue")


def test_an_unreachable_broker_means_no_limit_after_a_bounded_wait() -> None:
    started = time.monotonic()
    # Nothing listens on port 1: the connection is refused at once.
    assert poll_queue_length(app=_app("redis://127.0.0.1:1/0"), queue="celery") is None
    assert dispatch_room(app=_app("redis://127.0.0.1:1/0")) is None
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("url", ["memory://", "amqp://guest@127.0.0.1:1//"])
def test_a_broker_that_is_not_redis_means_no_limit(url: str) -> None:
    class _App:
        conf = SimpleNamespace(broker_url=url)

        def connection_for_read(self) -> object:
            raise ConnectionError("no such broker here")

    assert poll_queue_length(app=_App(), queue="celery") is None
