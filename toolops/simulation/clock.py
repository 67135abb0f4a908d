"""The virtual clock: one float of seconds since the simulation epoch, driven by the runner.

`virtual_time` patches, for the run only, `django.utils.timezone.now` (every ledger timestamp,
lease, deadline and poll schedule, auto_now fields included) and the `time` module as seen by the
modules that read it for waiting or rate (the QPS bucket, the in-place token wait, the submit
retry wait, the adapters' stream deadlines). A `sleep` moves the virtual clock instead of
waiting on the wall. In a sequential run it means "this caller waits, and nothing else happens
meanwhile". With poll threads (`--workers`), each poll runs on its own time from the instant it
started, so the waits of concurrent polls overlap instead of adding up (added up, they made
virtual time run ahead of the work: 4.6 polls per series in the 10,000-series run against 5.9
with overlapping waits). The jitter RNGs of scheduling and the QPS spread are replaced by seeded
ones so a run's plans and verdicts are a function of its seed.
"""

from __future__ import annotations

import contextlib
import importlib
import random
import threading
import time as _real_time
from collections.abc import Iterator
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from django.utils import timezone

from toolops.simulation.server import EPOCH

# Modules whose `time` global is replaced (each reads time.time, time.monotonic or time.sleep).
TIME_USERS = ("toolops.qps", "toolops.services.connections", "toolops.services.submit",
              "adapters.mcp_tasks_2025_inputs", "adapters.jsonrpc", "adapters.jsonrpc_stream")
SLEEP_OVERSHOOT_S = 1e-6
RNG_USERS = ("toolops.scheduling", "toolops.services.connections")


class VirtualClock:
    def __init__(self, *, start_s: float = 0.0) -> None:
        self._t = start_s
        self._lock = threading.Lock()
        self._worker = threading.local()  # a poll thread's own time within its poll

    def now_s(self) -> float:
        with self._lock:
            return self._t

    def set(self, t: float) -> None:
        with self._lock:
            self._t = max(self._t, t)  # time never goes back

    def work_begins(self) -> None:
        """A poll thread starts a poll: its own time starts at the clock's now."""
        self._worker.t = self.now_s()

    def work_ends(self) -> None:
        self._worker.t = None

    def sleep(self, seconds: float) -> None:
        """The caller waits. A poll thread waits on its own time, so waits of concurrent threads
        overlap as concurrent workers' do (two threads waiting 50 ms from one instant move the
        clock 50 ms, not 100); any other caller is the only one working, and moves the clock.
        A poll thread whose own time is behind the clock (others waited meanwhile) catches up
        first and then moves it, so a loop that waits until the clock passes a deadline ends."""
        seconds = max(float(seconds), 0.0)
        own = getattr(self._worker, "t", None)
        with self._lock:
            if own is None:
                self._t += seconds
                return
            own += seconds
            self._worker.t = own
            self._t = max(self._t, own)

    def now(self) -> datetime:
        return EPOCH + timedelta(seconds=self.now_s())


def _fake_time(clock: VirtualClock) -> Any:
    return SimpleNamespace(
        time=lambda: EPOCH.timestamp() + clock.now_s(),
        monotonic=lambda: clock.now_s(),
        # A real sleep always overshoots a little; an exact one would wake the token bucket a
        # float rounding short of its next token (0.999... < 1) and be refused again.
        sleep=lambda s: clock.sleep(float(s) + SLEEP_OVERSHOOT_S),
        perf_counter=_real_time.perf_counter,
    )


@contextlib.contextmanager
def virtual_time(clock: VirtualClock, *, seed: int) -> Iterator[None]:
    saved: list[tuple[Any, str, Any]] = [(timezone, "now", timezone.now)]
    fake = _fake_time(clock)
    for name in TIME_USERS:
        module = importlib.import_module(name)
        saved.append((module, "time", module.time))
    for name in RNG_USERS:
        module = importlib.import_module(name)
        saved.append((module, "_rng", module._rng))
    try:
        timezone.now = clock.now  # type: ignore[assignment]
        for name in TIME_USERS:
            importlib.import_module(name).time = fake  # type: ignore[attr-defined]
        for offset, name in enumerate(RNG_USERS):
            importlib.import_module(name)._rng = random.Random(f"{seed}:rng:{offset}")  # type: ignore[attr-defined]
        yield
    finally:
        for obj, attr, value in saved:
            setattr(obj, attr, value)
