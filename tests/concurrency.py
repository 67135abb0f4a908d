"""Helpers for tests that race real threads against PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connection, connections

from ledger.models import Operation
from toolops.services.observe import operation_poll


def poll_in_thread(op: Operation, owner: str, out: list[str]) -> threading.Thread:
    """Start a worker thread that polls `op` under lease `owner` and appends its outcome to `out`.

    The thread has its own database connection (closed when it ends), so its transactions really
    race the test's."""

    def run() -> None:
        try:
            out.append(operation_poll(operation_id=op.id, lease_owner=owner))
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def race_at_once(n: int, target: Callable[[], Any]) -> tuple[list[Any], list[BaseException]]:
    """Run `target` in n threads released at once; each thread has its own DB connection.
    Returns what the threads returned and what they raised."""
    barrier = threading.Barrier(n)
    results: list[Any] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            barrier.wait(timeout=10)
            value = target()
            with lock:
                results.append(value)
        except BaseException as exc:  # collected and asserted on by the caller
            with lock:
                errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results, errors


def wait_for_lock_waiter(*, timeout_s: float = 10.0) -> bool:
    """Block until some transaction waits on a row or table lock (pg_locks shows it ungranted).

    Used to release a lock holder only once the racing thread is really queued behind it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
            row = cur.fetchone()
            if row is not None and row[0] > 0:
                return True
        time.sleep(0.05)
    return False


def release_once_a_lock_is_awaited(release: threading.Event) -> None:
    """For a thread of its own: set `release` once some transaction waits on a lock (or after the
    wait_for_lock_waiter timeout), so a lock holder lets go only when its racer is queued."""
    try:
        wait_for_lock_waiter()
    finally:
        release.set()
        connection.close()


def submit_racing_a_rollback(submit: Callable[[], object]) -> list[object]:
    """Run `submit` in a thread of its own while another holds the server-wide rollout row's
    lock, as a rollback does, and once the submit waits on it writes what `rollout_move` writes
    first (the tasks path off) and commits. Returns what the submit returned or raised
    (SubmitRefused only; anything else fails the thread)."""
    from django.db import transaction

    from ledger.models import RolloutConfig
    from toolops.errors import SubmitRefused

    locked, release = threading.Event(), threading.Event()
    result: list[object] = []

    def rollback_holding_the_lock() -> None:
        try:
            with transaction.atomic():
                config = RolloutConfig.objects.select_for_update().get(tool_name="")
                locked.set()
                release.wait(10)
                config.tasks_enabled = False
                config.save()
        finally:
            connection.close()

    def run() -> None:
        try:
            result.append(submit())
        except SubmitRefused as exc:
            result.append(exc)
        finally:
            connection.close()

    holder = threading.Thread(target=rollback_holding_the_lock)
    holder.start()
    assert locked.wait(10)
    submitter = threading.Thread(target=run)
    submitter.start()
    wait_for_lock_waiter()  # until the submit waits on the rollout row's lock
    release.set()
    holder.join(15)
    submitter.join(15)
    return result
