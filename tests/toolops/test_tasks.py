"""The worker's process hooks (toolops/tasks.py), in real forked processes."""

from __future__ import annotations

import gc
import os
import struct
from pathlib import Path

import pytest
from celery.signals import worker_before_create_process

import toolops.tasks  # connects the hooks

_SMAPS = Path("/proc/self/smaps_rollup")

pytestmark = pytest.mark.skipif(not _SMAPS.exists() or not hasattr(os, "fork"),
                                reason="needs fork and /proc/self/smaps_rollup (Linux)")


def _private_dirty_kb() -> int:
    for line in _SMAPS.read_text().splitlines():
        if line.startswith("Private_Dirty:"):
            return int(line.split()[1])
    raise AssertionError("no Private_Dirty in smaps_rollup")


def _child_collect_dirties_kb() -> int:
    """Fork as the prefork pool does; the child runs one full collection and reports how many
    KB of the parent's shared pages that made its own (copied on write)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no Django, no database, only the collection and the pipe
        try:
            before = _private_dirty_kb()
            gc.collect()
            os.write(write_end, struct.pack("q", _private_dirty_kb() - before))
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        data = os.read(read_end, 8)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    return int(struct.unpack("q", data)[0])


def test_a_pool_child_does_not_copy_the_parents_heap_when_it_collects() -> None:
    # A heap of the size a worker parent holds after importing Django and the project (tens of
    # MB of objects the collector tracks), so the difference cannot hide in noise.
    heap = [{"k": i, "v": [i]} for i in range(300_000)]
    gc.collect()
    try:
        unfrozen = _child_collect_dirties_kb()
        worker_before_create_process.send(sender=None)  # what the pool sends before each fork
        assert gc.get_freeze_count() > len(heap)
        frozen = _child_collect_dirties_kb()
    finally:
        gc.unfreeze()  # the rest of the test run collects as usual
    assert unfrozen > 20_000, f"control: a collection in an unfrozen child copied only {unfrozen} KB"
    assert frozen < unfrozen / 4, f"frozen: {frozen} KB copied against {unfrozen} KB unfrozen"
    del heap


@pytest.mark.django_db(transaction=True)
def test_the_dispatcher_tick_refreshes_the_statistics_of_a_grown_operation_table(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import connection

    from ledger.services import statistics
    from tests.ledger.table_growth import grow_to as _grow_to
    from tests.ledger.table_growth import planned_rows as _planned_rows

    monkeypatch.setattr(statistics, "_next_check", 0.0)
    # Only the refresh is under test here: the tick's claims would poll the rows.
    monkeypatch.setattr(toolops.tasks, "operations_dispatch_following_due", lambda **_kw: 0)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE ledger_operation")
    _grow_to(800)  # past 2 x 0 rows + TOOLOPS_STATS_REFRESH_MIN_ROWS (500)
    toolops.tasks.dispatch_due()
    assert _planned_rows() >= 800
