"""Celery's thread pool, with a wake-up for the worker's event loop when a task ends.

With `-P threads`, a task runs on a pool thread and, acknowledged late (`poll_batch` is), is
acknowledged on that thread once it returns. The consumer's event loop (kombu's hub, on the main
thread) is not told: it sleeps in epoll until a socket or one of its timers wakes it. While it
sleeps, the Redis transport, whose prefetch window (concurrency x `worker_prefetch_multiplier`,
so four here) was full, does not ask for the next message, however many wait. With every pool
thread busy on a batch, each batch's end waited for the hub's next timer, seconds later, and the
dispatcher's ticks expired in the queue meanwhile: a fleet on `-P threads` made 5.4 calls/s in
the perf harness where the same fleet on prefork made about 250. Prefork, solo and the green
pools are not affected: their loops wake on the pool's own pipes or run on the task's thread.

`ThreadPool` gives the hub one more thing to read: a pipe, to which every task's end writes one
byte from the pool thread, after the task's callback (where the late ack is made). The hub reads
it and goes round its loop once more, which is where the transport asks for the next message
when its window has room again. `thread_pool_class` swaps it in for Celery's own when a worker
is started with `-P threads` (see `toolops.tasks`), so no option changes.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from typing import Any

from celery.concurrency import get_implementation
from celery.concurrency.thread import TaskPool


class ThreadPool(TaskPool):
    """Celery's thread pool whose tasks wake the worker's event loop when they end."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        read_end, write_end = os.pipe()
        # Neither end may block: a full pipe already holds a wake-up the loop has yet to read,
        # and the loop reads until the pipe is empty.
        os.set_blocking(read_end, False)
        os.set_blocking(write_end, False)
        self._wake_read: int | None = read_end
        self._wake_write: int | None = write_end
        # Held while an end is used or closed: a task still ending after the close (a cold
        # shutdown does not wait for the threads) must not write to a descriptor number the
        # process has since given to another file.
        self._wake_lock = threading.Lock()

    def register_with_event_loop(self, loop: Any) -> None:
        # Called each time the consumer starts its loop (a reconnect makes a new one).
        super().register_with_event_loop(loop)
        if self._wake_read is not None:
            loop.add_reader(self._wake_read, self._drain)

    def on_apply(self, *args: Any, **kwargs: Any) -> Any:
        result = super().on_apply(*args, **kwargs)
        # A future's done-callback runs after the whole target, the task's callback included.
        result.f.add_done_callback(self._wake)
        return result

    def on_close(self) -> None:
        super().on_close()
        with self._wake_lock:
            ends, self._wake_read, self._wake_write = (self._wake_read, self._wake_write), None, None
        for fd in ends:
            if fd is not None:
                os.close(fd)

    def _wake(self, _future: Future[Any] | None = None) -> None:
        with self._wake_lock:
            if self._wake_write is None:  # the pool is closed
                return
            try:
                os.write(self._wake_write, b"\0")
            except BlockingIOError:  # full: a wake-up is pending anyway
                pass

    def _drain(self, *_args: Any) -> None:
        with self._wake_lock:
            if self._wake_read is None:
                return
            try:
                while os.read(self._wake_read, 4096):
                    pass
            except BlockingIOError:  # empty
                pass


def thread_pool_class(pool_cls: Any) -> Any:
    """`ThreadPool` when `pool_cls` (a name such as "threads", or a class) is Celery's thread
    pool; any other pool unchanged."""
    try:
        implementation = get_implementation(pool_cls)
    except (ImportError, AttributeError, ValueError):
        return pool_cls  # the worker reports an unknown pool itself
    return ThreadPool if implementation is TaskPool else pool_cls
