"""The virtual clock: waits of concurrent poll threads overlap; a lone caller's waits add up."""

from __future__ import annotations

import threading

import pytest

from toolops.simulation.clock import VirtualClock


def test_waits_of_concurrent_poll_threads_overlap() -> None:
    clock = VirtualClock(start_s=10.0)
    started = threading.Barrier(3)

    def poll() -> None:
        clock.work_begins()  # both polls start at 10.0
        started.wait()
        clock.sleep(0.05)
        clock.sleep(0.05)
        clock.work_ends()

    threads = [threading.Thread(target=poll) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Three workers each waiting 100 ms from 10.0: the clock is at 10.1, not 10.3.
    assert clock.now_s() == pytest.approx(10.1)


def test_a_lone_caller_waits_on_the_clock_itself() -> None:
    clock = VirtualClock(start_s=1.0)
    clock.sleep(0.5)
    clock.sleep(0.25)
    assert clock.now_s() == pytest.approx(1.75)


def test_a_poll_thread_behind_the_clock_never_moves_it_back() -> None:
    clock = VirtualClock(start_s=0.0)
    clock.work_begins()
    clock.set(5.0)  # the runner (or another thread) moved on meanwhile
    clock.sleep(1.0)  # this poll's own time: 0 + 1 s
    assert clock.now_s() == 5.0
    clock.work_ends()


def test_a_wait_loop_on_a_lagging_poll_thread_ends() -> None:
    # A poll thread that waits until the clock passes a deadline (as the QPS door does) must get
    # there even when its own time started far behind the clock.
    clock = VirtualClock(start_s=0.0)
    clock.work_begins()
    clock.set(3.0)
    deadline = clock.now_s() + 0.2
    spins = 0
    while clock.now_s() < deadline:
        clock.sleep(0.05)
        spins += 1
        assert spins < 1000
    assert clock.now_s() >= deadline
    clock.work_ends()
