"""The poll threads of a worker process: a fixed set of threads running row jobs behind the
adaptive gate (toolops.services.poll_concurrency), each with its own Django connection, checked
at most every CONNECTION_CHECK_INTERVAL_SECONDS and after a failed row (toolops.services.poll_batch
explains why not before every row)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from django.db import close_old_connections, connections

from toolops.services.poll_concurrency import PollConcurrency

_STOP = object()
# How often a poll or holder thread checks its connection (toolops.services.poll_batch). A broken
# connection met in between fails one row, whose boundary reopens it and records the crash.
CONNECTION_CHECK_INTERVAL_SECONDS = 1.0


class ConnectionCheck:
    """`close_old_connections` on this thread when due: every interval, or after a failure."""

    def __init__(self) -> None:
        self._next = 0.0

    def __call__(self, *, failed: bool = False) -> None:
        now = time.monotonic()
        if failed or now >= self._next:
            close_old_connections()
            self._next = now + CONNECTION_CHECK_INTERVAL_SECONDS


class PollThreads:
    """A fixed set of threads running row jobs, at most `gate.limit` at once (the gate adapts it
    to the CPU to spare, toolops.services.poll_concurrency); each thread closes its DB
    connections when it stops."""

    def __init__(self, *, size: int, gate: PollConcurrency) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._gate = gate
        self._threads = [threading.Thread(target=self._run, name=f"toolops-poll-{i}", daemon=True)
                         for i in range(max(size, 1))]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        check = ConnectionCheck()
        failed = False
        try:
            while True:
                item = self._jobs.get()
                if item is _STOP:
                    return
                job, future = item
                # The job in hand waits for a slot, never a thread without one: a wait here is
                # rows asking for more polls in flight than the limit (the gate's demand signal).
                self._gate.acquire()
                try:
                    if not future.set_running_or_notify_cancel():
                        continue
                    check(failed=failed)  # a broken or expired connection is replaced first
                    outcome = job()
                    # A crash the boundary recorded may have left the connection broken.
                    failed = outcome.startswith("executor_error")
                    future.set_result(outcome)
                except BaseException as exc:  # the boundary returns labels; this is a last resort
                    failed = True
                    future.set_exception(exc)
                finally:
                    self._gate.release()
        finally:
            connections.close_all()

    def submit(self, job: Callable[[], str]) -> Future[str]:
        future: Future[str] = Future()
        self._jobs.put((job, future))
        return future

    def stop(self) -> None:
        for _ in self._threads:
            self._jobs.put(_STOP)
        self._gate.open()  # the jobs already taken run now, whatever the limit
        for thread in self._threads:
            thread.join(timeout=5.0)
