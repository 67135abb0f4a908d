"""Helpers for tests that race real threads against PostgreSQL."""

from __future__ import annotations

import threading

from django.db import connection

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
