"""The fleet bucket's prefetched grants, against a real Redis: fewer round trips at high caps,
never a grant past its send deadline, exact counts once reported, the cap held across processes.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from toolops.qps import (
    PREFETCH_HORIZON_SECONDS,
    Take,
    qps_capacity,
    send_deadline_seconds,
    wire_allowance_seconds,
    wire_rate,
)
from toolops.qps_redis import RedisTokenBucket

BROKER = os.environ.get("TOOLOPS_TEST_BROKER_URL", "redis://127.0.0.1:6379/15")
# A cap no request rate here reaches (the perf harness's): the bucket holds 91 grants.
FAST = wire_rate(cap=100000.0)


class _Counted:
    """Counts the take script's round trips (and can make the next one fail)."""

    def __init__(self, script: Any) -> None:
        self.script = script
        self.calls = 0
        self.fail_next = False

    def __call__(self, **kwargs: Any) -> Any:
        self.calls += 1
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("redis went away")
        return self.script(**kwargs)


def _busy(b: RedisTokenBucket, key: str, *, takes: int) -> list[Take]:
    """A process taking `takes` tokens back to back (its demand then asks for more per trip)."""
    with override_settings(TOOLOPS_QPS_SEND_DEADLINE_SECONDS=5.0):
        return [b.take(key=key, rate=FAST, purpose="poll") for _ in range(takes)]


@pytest.fixture
def bucket() -> Iterator[tuple[RedisTokenBucket, str, _Counted]]:
    b = RedisTokenBucket(url=BROKER)
    counted = _Counted(b._script)
    b._script = counted
    key = f"test:prefetch:{uuid.uuid4().hex}"
    yield b, key, counted
    b.reset(key=key)


def test_capacity_holds_one_token_below_a_thousand_a_second_and_a_millisecond_above() -> None:
    assert qps_capacity(rate=999.0) == 1.0
    assert qps_capacity(rate=FAST) == 91.0
    # Arrivals move by at most the horizon: the allowance covers it beside the send deadline.
    assert wire_allowance_seconds() >= send_deadline_seconds() + PREFETCH_HORIZON_SECONDS


def test_a_busy_process_takes_several_grants_per_round_trip_and_reports_them_exactly(
    bucket: tuple[RedisTokenBucket, str, _Counted],
) -> None:
    b, key, counted = bucket
    purposes = ["poll", "result"] * 50
    with override_settings(TOOLOPS_QPS_SEND_DEADLINE_SECONDS=5.0):
        takes = [b.take(key=key, rate=FAST, purpose=p) for p in purposes]
    assert all(t.granted for t in takes)
    # The first take knows of no demand; then each round trip brings up to 8 grants.
    assert counted.calls <= 2 + len(takes) // 4
    assert sum(t.asked_at is not None for t in takes) == len(takes) - counted.calls
    stats = b.stats(key=key)  # reports this process's sent grants first
    assert stats.total == len(takes)
    assert stats.by_purpose == {"poll": 50, "result": 50}
    # What the process still holds is out, not sent; given up at its end, it is abandoned.
    held = len(b._prefetched[key].grants)
    assert (stats.prefetched, stats.abandoned) == (held, 0)
    # Every grant is in the per-second counters (the peak's) from its grant on, held ones too.
    seconds = b._redis.keys(b._keys(key)[2] + "*")
    assert sum(int(b._redis.get(s)) for s in seconds) == len(takes) + held
    assert stats.peak_in_one_second <= len(takes) + held
    b.report_all()
    stats = b.stats(key=key)
    assert (stats.total, stats.prefetched, stats.abandoned) == (len(takes), 0, held)


def test_a_prefetched_grant_counts_its_deadline_from_the_take_that_brought_it(
    bucket: tuple[RedisTokenBucket, str, _Counted],
) -> None:
    b, key, counted = bucket
    with override_settings(TOOLOPS_QPS_SEND_DEADLINE_SECONDS=5.0):
        b.take(key=key, rate=FAST, purpose="poll")
        before = time.monotonic()
        b.take(key=key, rate=FAST, purpose="poll")  # demand 2: its own grant and one more
        after = time.monotonic()
        third = b.take(key=key, rate=FAST, purpose="poll")
    assert counted.calls == 2
    assert third.granted and third.asked_at is not None and before <= third.asked_at <= after


def test_a_prefetched_grant_past_the_send_deadline_is_never_handed_out(
    bucket: tuple[RedisTokenBucket, str, _Counted],
) -> None:
    b, key, counted = bucket
    with override_settings(TOOLOPS_QPS_SEND_DEADLINE_SECONDS=0.05):
        b.take(key=key, rate=FAST, purpose="poll")
        b.take(key=key, rate=FAST, purpose="poll")  # brings one grant more
        time.sleep(0.1)
        late = b.take(key=key, rate=FAST, purpose="poll")
    assert counted.calls == 3 and late.granted and late.asked_at is None
    stats = b.stats(key=key)
    # The stale grant: spent, never sent, counted as given up; the three requests are the total.
    assert (stats.total, stats.abandoned, stats.prefetched) == (3, 1, 0)


def test_below_a_thousand_a_second_every_take_is_its_own_round_trip(
    bucket: tuple[RedisTokenBucket, str, _Counted],
) -> None:
    b, key, counted = bucket
    rate = 500.0
    granted = 0
    until = time.monotonic() + 0.5
    with override_settings(TOOLOPS_QPS_SEND_DEADLINE_SECONDS=5.0):
        while time.monotonic() < until:
            take = b.take(key=key, rate=rate, purpose="poll")
            assert take.asked_at is None
            granted += take.granted
            if not take.granted:
                time.sleep(take.wait_s)
    stats = b.stats(key=key)
    assert stats.total == granted and stats.prefetched == 0
    assert granted <= rate * 0.5 + 2


def test_a_report_that_fails_to_reach_redis_goes_with_the_next_take(
    bucket: tuple[RedisTokenBucket, str, _Counted],
) -> None:
    b, key, counted = bucket
    _busy(b, key, takes=6)
    with override_settings(TOOLOPS_QPS_SEND_DEADLINE_SECONDS=5.0):
        while b._prefetched[key].grants:  # use up what this process holds
            b.take(key=key, rate=FAST, purpose="result")
        counted.fail_next = True
        with pytest.raises(ConnectionError):
            b.take(key=key, rate=FAST, purpose="poll")
        b.take(key=key, rate=FAST, purpose="poll")
    b.report_all()
    stats = b.stats(key=key)
    # Every grant that went out is counted once; the failed take sent nothing.
    sent = stats.by_purpose["poll"] + stats.by_purpose["result"]
    assert stats.total == sent and stats.prefetched == 0
    assert stats.by_purpose["poll"] == 7


def test_a_forked_child_never_sends_its_parents_grants(
    bucket: tuple[RedisTokenBucket, str, _Counted],
) -> None:
    b, key, counted = bucket
    _busy(b, key, takes=4)
    held = len(b._prefetched[key].grants)
    assert held > 0
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()
    child = ctx.Process(target=_child_take, args=(b, key, out))
    child.start()
    assert out.get(timeout=30) is None  # the child's grant came from its own round trip
    child.join(timeout=30)
    assert len(b._prefetched[key].grants) == held


def _child_take(b: RedisTokenBucket, key: str, out: multiprocessing.Queue) -> None:
    take = b.take(key=key, rate=FAST, purpose="poll")
    b.report_all()
    out.put(take.asked_at)


CAP = 3000.0
RUN_SECONDS = 2.0


def _hammer(key: str, until: float, out: multiprocessing.Queue) -> None:
    bucket = RedisTokenBucket(url=BROKER)
    granted = 0
    while time.time() < until:
        take = bucket.take(key=key, rate=wire_rate(cap=CAP), purpose="poll")
        if take.granted:
            granted += 1
        else:
            time.sleep(take.wait_s)
    bucket.report_all()  # a forked process ends without atexit
    out.put(granted)


def test_four_processes_prefetching_hold_the_cap() -> None:
    key = f"test:prefetch-cap:{uuid.uuid4().hex}"
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()
    started = time.time()
    until = started + RUN_SECONDS
    procs = [ctx.Process(target=_hammer, args=(key, until, out)) for _ in range(4)]
    for p in procs:
        p.start()
    granted = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    ended = time.time()
    bucket = RedisTokenBucket(url=BROKER)
    stats = bucket.stats(key=key)
    rate = wire_rate(cap=CAP)
    assert stats.prefetched == 0
    assert stats.total == sum(granted)
    # Grants, sent or given up, never above the cap in any second, nor above the refill overall.
    assert stats.peak_in_one_second <= CAP
    assert stats.total + stats.abandoned <= rate * (ended - started) + qps_capacity(rate=rate)
    assert sum(granted) >= 0.5 * rate * RUN_SECONDS  # the processes really got the rate
    bucket.reset(key=key)
