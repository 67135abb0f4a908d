"""The thread pool that wakes the worker's event loop (toolops/worker_pool.py), with Celery's own
executor and kombu's own hub: nothing stands in for either."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery.concurrency.solo import TaskPool as SoloPool
from celery.concurrency.thread import TaskPool
from celery.worker import WorkController
from kombu.asynchronous import Hub

import toolops.tasks  # noqa: F401  (connects the worker hooks)
from config.celery import app
from toolops.worker_pool import ThreadPool, thread_pool_class


@pytest.fixture
def pool_and_hub() -> Iterator[tuple[ThreadPool, Hub]]:
    pool, hub = ThreadPool(limit=2), Hub()
    pool.start()
    pool.register_with_event_loop(hub)
    try:
        yield pool, hub
    finally:
        pool.stop()
        pool.close()
        hub.close()


def _readable(hub: Hub, timeout: float) -> set[int]:
    return {fd for fd, _event in (hub.poller.poll(timeout) or [])}


def test_a_task_that_ends_wakes_the_event_loop_after_its_callback(
    pool_and_hub: tuple[ThreadPool, Hub],
) -> None:
    pool, hub = pool_and_hub
    seen: list[str] = []

    def callback(_result: Any) -> None:
        # Where the late ack is made. The wake-up must come after it: a loop woken before the
        # ack would find the prefetch window still full and sleep again.
        time.sleep(0.3)
        seen.append("acked")

    pool.apply_async(lambda: "done", callback=callback)
    assert pool._wake_read in _readable(hub, 5.0), "the loop was not woken when the task ended"
    assert seen == ["acked"], "the loop was woken before the task's callback ran"


def test_the_loop_sleeps_while_no_task_ends(pool_and_hub: tuple[ThreadPool, Hub]) -> None:
    pool, hub = pool_and_hub
    release = threading.Event()
    pool.apply_async(release.wait, args=(10,), callback=lambda _r: None)
    assert pool._wake_read not in _readable(hub, 0.3), "woken while the task still runs"
    release.set()
    assert pool._wake_read in _readable(hub, 5.0)


def test_reading_the_wake_ups_empties_the_pipe(pool_and_hub: tuple[ThreadPool, Hub]) -> None:
    pool, hub = pool_and_hub
    done = threading.Semaphore(0)
    for _ in range(20):
        pool.apply_async(lambda: None, callback=lambda _r: done.release())
    for _ in range(20):
        assert done.acquire(timeout=5)
    time.sleep(0.1)  # the done-callbacks run just after the task's callback
    assert pool._wake_read in _readable(hub, 1.0)
    pool._drain()
    assert pool._wake_read not in _readable(hub, 0.2), "wake-ups left in the pipe after a drain"


def test_a_wake_up_after_the_pool_closed_is_dropped() -> None:
    pool = ThreadPool(limit=1)
    pool.start()
    pool.stop()
    pool.close()
    # The closed descriptors' numbers go to the next files the process opens: a late task's
    # end must not write into them.
    read_end, write_end = os.pipe()
    try:
        os.set_blocking(read_end, False)
        pool._wake()
        with pytest.raises(BlockingIOError):
            os.read(read_end, 1)
        os.write(write_end, b"x")
        pool._drain()  # nor read from them
        assert os.read(read_end, 1) == b"x"
    finally:
        os.close(read_end)
        os.close(write_end)


@pytest.mark.parametrize("given", ["threads", "celery.concurrency.thread:TaskPool", TaskPool])
def test_celerys_thread_pool_becomes_the_waking_one(given: object) -> None:
    assert thread_pool_class(given) is ThreadPool


@pytest.mark.parametrize("given", ["prefork", "solo", "no-such-pool", ThreadPool])
def test_any_other_pool_is_left_as_given(given: object) -> None:
    assert thread_pool_class(given) is given


@pytest.mark.parametrize(("pool_name", "expected"), [("threads", ThreadPool), ("solo", SoloPool)])
def test_a_worker_started_with_threads_builds_the_waking_pool(pool_name: str, expected: type) -> None:
    # Celery's own worker, built (not started) as `celery worker -P <name>` builds it: the
    # worker_init hook runs before the pool is made.
    worker = WorkController(app=app, pool_cls=pool_name, concurrency=1, hostname="pool@test",
                            without_gossip=True, without_mingle=True, without_heartbeat=True)
    try:
        assert type(worker.pool) is expected
    finally:
        worker.pool.stop()
        worker.pool.close()
