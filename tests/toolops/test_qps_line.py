"""The line of refused polls in a server's QPS bucket (toolops.qps, "the line"), in the embedded
bucket on a clock the test moves and in the Redis script on Redis's own clock, and the cap still
held with holders and outside callers mixed under concurrent worker processes."""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

import toolops.qps as qps
from toolops.qps import SLOT_FORGET_SECONDS, LocalTokenBucket, TokenBucket
from toolops.qps_redis import RedisTokenBucket

BROKER = os.environ.get("TOOLOPS_TEST_BROKER_URL", "redis://127.0.0.1:6379/15")
RATE = 8.0  # one token every 125 ms: binary fractions, so the fake clock adds up exactly
TICK = 1.0 / RATE


class _Clock:
    def __init__(self) -> None:
        self.t = 1024.0

    def time(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(qps, "time", SimpleNamespace(time=c.time, monotonic=c.time, sleep=None))
    return c


def _take(bucket: TokenBucket, holder: str | None) -> Any:
    return bucket.take(key="k", rate=RATE, purpose="poll", holder=holder)


def test_refused_holders_get_slots_one_token_apart_in_the_order_they_asked(clock: _Clock) -> None:
    bucket = LocalTokenBucket()
    assert _take(bucket, "a").granted
    waits = [_take(bucket, h) for h in ("b", "c", "d")]
    assert all(not w.granted and w.queued for w in waits)
    assert [round(w.wait_s, 6) for w in waits] == [round(TICK, 6), round(2 * TICK, 6),
                                                   round(3 * TICK, 6)]
    # Each comes back at its slot and finds its token: one refusal per request, no more.
    for holder in ("b", "c", "d"):
        clock.t += TICK
        assert _take(bucket, holder).granted, holder
    assert bucket.stats(key="k").denied == 3


def test_a_newcomer_joins_the_end_of_the_line_even_when_a_token_is_there(clock: _Clock) -> None:
    bucket = LocalTokenBucket()
    assert _take(bucket, "a").granted
    assert _take(bucket, "b").wait_s == pytest.approx(TICK)
    assert _take(bucket, "c").wait_s == pytest.approx(2 * TICK)
    clock.t += TICK  # b's slot: one token in the bucket
    late = _take(bucket, "newcomer")
    assert not late.granted and late.queued and late.wait_s == pytest.approx(2 * TICK)
    assert _take(bucket, "b").granted, "the token was kept for the holder whose slot it is"


def test_a_holder_back_early_keeps_its_place_and_is_told_how_long_is_left(clock: _Clock) -> None:
    bucket = LocalTokenBucket()
    assert _take(bucket, "a").granted
    _take(bucket, "b")
    _take(bucket, "c")
    clock.t += TICK / 2
    early = _take(bucket, "c")
    assert not early.granted and early.queued and early.wait_s == pytest.approx(1.5 * TICK)
    clock.t += TICK / 2
    assert _take(bucket, "b").granted
    clock.t += TICK
    assert _take(bucket, "c").granted


def test_a_grant_outside_the_line_moves_everyone_waiting_back_one_token(clock: _Clock) -> None:
    bucket = LocalTokenBucket()
    assert _take(bucket, "a").granted
    _take(bucket, "b")  # slot +1
    _take(bucket, "c")  # slot +2
    clock.t += TICK
    # A follow-up (no holder) takes b's token: the cap serves it, and b and c wait one more.
    assert _take(bucket, None).granted
    not_yet = _take(bucket, "b")
    assert not not_yet.granted and not_yet.wait_s == pytest.approx(TICK)
    clock.t += TICK
    assert _take(bucket, "b").granted
    assert not _take(bucket, "c").granted
    clock.t += TICK
    assert _take(bucket, "c").granted


def test_a_holder_whose_turn_came_without_a_token_stays_first(clock: _Clock) -> None:
    bucket = LocalTokenBucket()
    assert _take(bucket, "a").granted
    _take(bucket, "b")
    _take(bucket, "c")
    clock.t += 2 * TICK  # b came late: c's slot has come too, and there is one token
    assert _take(bucket, "c").granted
    turn = _take(bucket, "b")
    assert not turn.granted and turn.queued and turn.wait_s == pytest.approx(TICK)
    assert not _take(bucket, "newcomer").granted
    clock.t += TICK
    assert _take(bucket, "b").granted


def test_the_line_never_grants_above_the_cap(clock: _Clock) -> None:
    """Holders, newcomers and outside callers, asking every 1/64 s for 30 s of the fake clock."""
    bucket = LocalTokenBucket()
    grants: list[float] = []
    due: dict[str, float] = {}
    start = clock.t
    n = 0
    while clock.t < start + 30:
        n += 1
        callers: list[str | None] = [f"h{n}", None] if n % 3 == 0 else [f"h{n}"]
        callers += [h for h, at in due.items() if at <= clock.t]
        for holder in callers:
            take = _take(bucket, holder)
            if holder is not None:
                due.pop(holder, None)
            if take.granted:
                grants.append(clock.t)
            elif holder is not None and take.queued:
                due[holder] = clock.t + take.wait_s
        clock.t += 0.01
    assert len(grants) <= RATE * 30 + 1
    # No sliding second holds more than the rate (the bucket's capacity is one token).
    j = 0
    for i, at in enumerate(grants):
        while grants[j] <= at - 1.0:
            j += 1
        assert i - j + 1 <= RATE + 1
    assert len(grants) >= 0.95 * RATE * 30, "the line wastes no token while callers wait"


def test_a_slot_never_claimed_is_forgotten(clock: _Clock) -> None:
    bucket = LocalTokenBucket()
    assert _take(bucket, "a").granted
    _take(bucket, "gone")
    clock.t += SLOT_FORGET_SECONDS + 61
    _take(bucket, "other")  # any take past the minute sweeps
    assert "gone" not in bucket._slots["k"]


# -- the Redis script: the same line on Redis's clock -------------------------------------------

@pytest.fixture
def redis_bucket() -> tuple[RedisTokenBucket, str]:
    return RedisTokenBucket(url=BROKER), f"test:{uuid.uuid4().hex}"


def test_redis_line_serves_holders_in_order_one_refusal_each(
    redis_bucket: tuple[RedisTokenBucket, str],
) -> None:
    bucket, key = redis_bucket
    rate = 5.0  # 200 ms apart: wide enough for the round trips of a loaded machine
    assert bucket.take(key=key, rate=rate, purpose="poll", holder="a").granted
    waits = {h: bucket.take(key=key, rate=rate, purpose="poll", holder=h) for h in ("b", "c")}
    assert all(w.queued and not w.granted for w in waits.values())
    assert waits["c"].wait_s - waits["b"].wait_s == pytest.approx(1 / rate, abs=0.02)
    started = time.monotonic()
    time.sleep(waits["b"].wait_s)
    newcomer = bucket.take(key=key, rate=rate, purpose="poll", holder="n")
    assert not newcomer.granted and newcomer.queued, "a newcomer queues behind c"
    assert bucket.take(key=key, rate=rate, purpose="poll", holder="b").granted
    early = bucket.take(key=key, rate=rate, purpose="poll", holder="c")
    assert not early.granted and early.queued and early.wait_s > 0.05
    time.sleep(max(waits["c"].wait_s - (time.monotonic() - started), 0) + 0.01)
    assert bucket.take(key=key, rate=rate, purpose="poll", holder="c").granted
    assert bucket.stats(key=key).denied == 4
    bucket.reset(key=key)


def test_redis_outside_grant_moves_the_line_back(redis_bucket: tuple[RedisTokenBucket, str]) -> None:
    bucket, key = redis_bucket
    rate = 5.0
    assert bucket.take(key=key, rate=rate, purpose="poll", holder="a").granted
    first = bucket.take(key=key, rate=rate, purpose="poll", holder="b")
    bucket.take(key=key, rate=rate, purpose="poll", holder="c")
    time.sleep(first.wait_s + 0.01)
    assert bucket.take(key=key, rate=rate, purpose="cancel").granted  # outside the line
    # c's slot was two tokens after a's grant; the cancel took one, so it is now three.
    moved = bucket.take(key=key, rate=rate, purpose="poll", holder="c")
    assert not moved.granted and moved.queued and moved.wait_s == pytest.approx(2 / rate, abs=0.05)
    bucket.reset(key=key)


def _mixed_worker(url: str, key: str, until: float, index: int, out: multiprocessing.Queue) -> None:
    """Holders that come back at their slots, and every third request outside the line."""
    bucket = RedisTokenBucket(url=url)
    granted = n = 0
    while time.time() < until:
        n += 1
        holder = None if n % 3 == 0 else f"w{index}-{n}"
        while True:
            take = bucket.take(key=key, rate=20.0, purpose="poll", holder=holder)
            if take.granted:
                granted += 1
                break
            time.sleep(take.wait_s)
            if time.time() >= until:
                break
    out.put(granted)


def test_redis_line_holds_the_cap_under_four_processes(
    redis_bucket: tuple[RedisTokenBucket, str],
) -> None:
    bucket, key = redis_bucket
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()
    started = time.time()
    until = started + 3.0
    procs = [ctx.Process(target=_mixed_worker, args=(BROKER, key, until, i, out)) for i in range(4)]
    for p in procs:
        p.start()
    granted = sum(out.get(timeout=30) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    stats = bucket.stats(key=key)
    assert stats.total == granted
    assert stats.peak_in_one_second <= 20
    assert granted <= 20 * (time.time() - started) + 1
    assert granted >= 0.8 * 20 * 3.0
    bucket.reset(key=key)
