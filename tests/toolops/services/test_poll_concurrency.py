"""The adaptive gate on a worker process's polls in flight: its reading of the machine's idle
CPU, its limit under a saturated and an idle machine, and real threads held to that limit."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from toolops.services import poll_concurrency
from toolops.services.poll_concurrency import (
    EVAL_SECONDS,
    CpuToSpare,
    PollConcurrency,
    cpu_idle_reader,
    poll_concurrency_new,
    process_busy_reader,
)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def step(self) -> None:
        self.now += EVAL_SECONDS


def _passes(gate: PollConcurrency, clock: _Clock, n: int, *, wanted: bool = False) -> None:
    """`n` evaluations: the clock moves one evaluation on and a poll passes through the gate,
    with a row having waited for a slot before each when `wanted`."""
    for _ in range(n):
        if wanted:
            gate._wanted = True
        clock.step()
        gate.acquire()
        gate.release()


def _stat(path: Path, *, idle: int, busy: int) -> None:
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    path.write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n")


def test_the_idle_share_is_read_from_proc_stat_between_two_calls(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    _stat(stat, idle=100, busy=100)
    read = cpu_idle_reader(str(stat))
    assert read is not None
    _stat(stat, idle=130, busy=200)  # 30 idle ticks of 130
    assert read() == pytest.approx(30 / 130)
    assert read() is None  # nothing elapsed since the last call
    _stat(stat, idle=230, busy=200)
    assert read() == pytest.approx(1.0)


def test_iowait_counts_as_idle_and_guest_time_is_not_counted_twice(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  0 0 0 0 0 0 0 0 0 0\n")
    read = cpu_idle_reader(str(stat))
    assert read is not None
    # 10 user (of which 5 guest), 10 idle, 20 iowait: 30 of 40 idle.
    stat.write_text("cpu  10 0 0 10 20 0 0 0 5 0\n")
    assert read() == pytest.approx(30 / 40)


def test_with_no_reading_at_all_the_gate_is_fixed_at_its_threads(tmp_path: Path) -> None:
    assert cpu_idle_reader(str(tmp_path / "missing")) is None
    gate = PollConcurrency(most=4, idle=None, busy=None)
    assert gate.limit == 4


def test_the_process_reading_is_its_cpu_time_over_wall_time() -> None:
    wall = [10.0]
    used = [1.0]
    read = process_busy_reader(clock=lambda: wall[0], cpu=lambda: used[0])
    wall[0], used[0] = 12.0, 2.5  # 1.5 s of CPU in 2 s
    assert read() == pytest.approx(0.75)
    assert read() is None  # no time elapsed


def test_a_process_that_keeps_a_core_busy_takes_its_limit_down_on_an_idle_machine() -> None:
    clock = _Clock()
    gate = PollConcurrency(most=4, idle=lambda: 0.9, busy=lambda: 0.95, clock=clock)
    gate._limit = 4
    _passes(gate, clock, 5)
    assert gate.limit == 1


def test_without_the_machine_reading_the_process_reading_decides() -> None:
    clock = _Clock()
    busy = [0.1]
    gate = PollConcurrency(most=3, idle=None, busy=lambda: busy[0], clock=clock)
    _passes(gate, clock, 3, wanted=True)
    assert gate.limit == 3
    busy[0] = 0.99
    _passes(gate, clock, 3)
    assert gate.limit == 1


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="Linux only")
def test_on_linux_the_machine_reading_is_a_share() -> None:
    read = cpu_idle_reader()
    assert read is not None
    time.sleep(0.05)
    share = read()
    assert share is None or 0.0 <= share <= 1.0
    assert poll_concurrency_new(most=3, adaptive=True).limit == 1
    assert poll_concurrency_new(most=3, adaptive=False).limit == 3


def test_a_saturated_machine_takes_the_limit_down_to_one_and_no_lower() -> None:
    clock = _Clock()
    gate = PollConcurrency(most=4, idle=lambda: 1.0, clock=clock)
    gate._limit = 4  # as if an idle spell had raised it
    gate._idle = lambda: 0.02
    _passes(gate, clock, 6)
    assert gate.limit == 1


def test_an_idle_machine_raises_the_limit_only_while_rows_wait_for_a_slot() -> None:
    clock = _Clock()
    gate = PollConcurrency(most=4, idle=lambda: 0.9, clock=clock)
    _passes(gate, clock, 5)  # one poll at a time: nobody waits, nothing is raised
    assert gate.limit == 1
    _passes(gate, clock, 1, wanted=True)  # a row waited for the slot
    assert gate.limit == 2


def test_between_the_thresholds_the_limit_stays() -> None:
    clock = _Clock()
    share = (poll_concurrency.IDLE_LOW + poll_concurrency.IDLE_HIGH) / 2
    gate = PollConcurrency(most=4, idle=lambda: share, clock=clock)
    gate._limit = 2
    _passes(gate, clock, 5, wanted=True)
    assert gate.limit == 2


def _run_jobs(gate: PollConcurrency, *, threads: int, jobs: int, seconds: float) -> int:
    """Real threads each running jobs through the gate; the most that ran at once."""
    lock = threading.Lock()
    running = 0
    most = 0
    left = [jobs]

    def worker() -> None:
        nonlocal running, most
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            gate.acquire()
            try:
                with lock:
                    running += 1
                    most = max(most, running)
                time.sleep(seconds)
                with lock:
                    running -= 1
            finally:
                gate.release()

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in pool)
    return most


def test_threads_on_a_saturated_machine_run_one_at_a_time() -> None:
    gate = PollConcurrency(most=4, idle=lambda: 0.0)
    assert _run_jobs(gate, threads=4, jobs=24, seconds=0.02) == 1


def test_threads_on_an_idle_machine_reach_every_thread() -> None:
    # Four threads, each job long enough for the waiting rows to see several evaluations.
    gate = PollConcurrency(most=4, idle=lambda: 0.9)
    assert _run_jobs(gate, threads=4, jobs=40, seconds=0.1) == 4
    assert gate.limit == 4


def test_opening_the_gate_lets_every_waiter_through() -> None:
    gate = PollConcurrency(most=4, idle=lambda: 0.0)
    gate.acquire()  # the only slot
    through = threading.Event()

    def waiter() -> None:
        gate.acquire()
        through.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    assert not through.wait(0.3)
    gate.open()
    assert through.wait(2.0)
    thread.join(timeout=2.0)


def test_a_worker_process_gate_follows_the_settings() -> None:
    from django.test.utils import override_settings

    from toolops.services import poll_batch

    for adaptive, first_limit in ((True, 1), (False, 3)):
        with override_settings(TOOLOPS_POLL_THREADS=3, TOOLOPS_POLL_ADAPTIVE=adaptive):
            poll_batch.poll_threads_stop()
            threads, _holder = poll_batch._pool()
            try:
                gate = threads._gate
                assert gate.most == 3
                assert gate.limit == first_limit
            finally:
                poll_batch.poll_threads_stop()


def test_every_change_of_the_limit_is_reported() -> None:
    clock = _Clock()
    seen: list[int] = []
    gate = PollConcurrency(most=3, idle=lambda: 0.9, clock=clock, on_limit=seen.append)
    _passes(gate, clock, 4, wanted=True)
    gate._idle = lambda: 0.0
    _passes(gate, clock, 4)
    assert seen == [1, 2, 3, 2, 1]


def test_a_reporter_that_fails_never_stops_a_poll() -> None:
    def broken(_limit: int) -> None:
        raise RuntimeError("metrics directory gone")

    gate = PollConcurrency(most=2, idle=lambda: 0.0, on_limit=broken)
    gate.acquire()
    gate.release()


@pytest.mark.django_db
def test_the_limit_is_a_metric_while_the_threads_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.test.utils import override_settings

    from toolops.metrics import metrics_render
    from toolops.services import poll_batch

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)

    def gauge() -> float:
        text = metrics_render()[0].decode()
        line = next(x for x in text.splitlines() if x.startswith("toolops_poll_concurrency_limit "))
        return float(line.split()[1])

    with override_settings(TOOLOPS_POLL_THREADS=3, TOOLOPS_POLL_ADAPTIVE=False):
        poll_batch.poll_threads_stop()
        poll_batch._pool()
        try:
            assert gauge() == 3.0
        finally:
            poll_batch.poll_threads_stop()
        assert gauge() == 0.0


def test_cpu_to_spare_follows_the_machine_reading_once_per_window() -> None:
    clock = _Clock()
    readings = [0.05, 0.6, 0.2]
    spare = CpuToSpare(idle=lambda: readings.pop(0), clock=clock)
    assert spare()  # no window has passed yet: the first verdict is yes
    clock.step()
    assert not spare()  # 5 % idle: saturated
    assert not spare() and len(readings) == 2  # within the window the verdict stands, unread
    clock.step()
    assert spare()  # 60 % idle
    clock.step()
    assert not spare()  # 20 %: not more than IDLE_HIGH


def test_cpu_to_spare_without_a_reading_says_yes_and_an_unreadable_moment_changes_nothing(
        tmp_path: Path) -> None:
    assert CpuToSpare(idle=cpu_idle_reader(str(tmp_path / "missing")))()
    clock = _Clock()
    answers: list[float | None] = [0.05, None]
    spare = CpuToSpare(idle=lambda: answers.pop(0), clock=clock)
    clock.step()
    assert not spare()
    clock.step()
    assert not spare()  # nothing elapsed on the machine's counters: the last verdict stands


def test_the_processs_cpu_to_spare_reads_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(poll_concurrency, "_spare", None)
    assert isinstance(poll_concurrency.machine_cpu_to_spare(), bool)
    made = poll_concurrency._spare
    assert made is not None and poll_concurrency.machine_cpu_to_spare() in (True, False)
    assert poll_concurrency._spare is made  # one per process
