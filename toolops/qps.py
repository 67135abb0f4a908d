"""A hard per-server cap on requests per second: token buckets shared by every protocol call.

Fleet: one bucket per server in Redis, taken by ONE Lua script, so the refill, the take and the
request counters are atomic across every worker process (no read-modify-write race between
workers). The script reads the clock with Redis `TIME`, so workers with skewed clocks share one
time line. Embedded: the same algorithm in process memory behind a lock.

Why a bucket of capacity one by default: a bucket of capacity `b` refilled at `r`/s lets any one
second see up to `b + r` grants. With `b = 1` grants are spaced apart, one at a time.

The promise is about ARRIVALS at the server, not grants (docs/conformance.md, "The cap at the
wire"). A request leaves some time after its grant (a busy core, GC, connection setup), so two
requests granted `1/r` apart can arrive closer than that. Two rules close the gap:
* a send deadline `D` (TOOLOPS_QPS_SEND_DEADLINE_SECONDS): a grant older than `D` when its
  request is about to leave is abandoned (still spent) and the request takes a fresh one, so a
  request arrives within `D + e` of its grant, `e` being the gate-to-server latency;
* a wire margin `A >= D + e` (TOOLOPS_QPS_WIRE_ALLOWANCE_SECONDS): with `n = max(1, floor(cap))`
  grants are spaced `max(1/cap, (1 + A) / n)` apart, so any `n + 1` arrivals span at least
  `n * (1 + A) / n - (D + e) >= 1` second: no sliding one-second window at the server holds more
  than `n`, i.e. the configured cap. The price is a rate `A` (10%) below the cap.

The horizon: at high caps a grant may come up to `H` (PREFETCH_HORIZON_SECONDS, 1 ms) before its
even slot. The bucket's capacity is `max(burst, 1 + floor(r * H))`: 1 below 1,000 grants a second,
so nothing changes there, and above it the bucket holds the grants of the next millisecond. A
request then arrives within `[slot - H, slot + D + e]`, so the allowance must cover `D + e + H`
(wire_allowance_seconds never returns less than `D + H`). What it buys: the fleet bucket can hand
one process several grants in one script call (toolops.qps_redis, "prefetched grants"), so a
worker sending hundreds of requests a second to one server pays a Redis round trip for a few of
them instead of each. Each prefetched grant is still one token, spent by one request within the
send deadline of the call that took it, or abandoned.

The observed-rate figures (total, per purpose, peak in one second) are counted by the same script
in Redis, not in a SQL table: a row per request would add one INSERT to every poll (the hottest
path), while an INCR inside the script we already run costs no extra round trip. The peak is kept
as a running maximum over calendar seconds, so the report reads three small keys per server.

The line: a refused caller that names itself (`holder`, the operation's id) is given a slot, the
next free one after everybody refused before it, spaced one token interval apart, and is told to
come back exactly then (its row is rescheduled to the slot; toolops.services.schedule). A caller
whose slot has come takes the token ahead of anyone who just arrived, and a newcomer that finds
people waiting joins the end of the line even when a token happens to be there. So under a
saturated cap a row is refused about once per request it sends, in the order it first asked,
instead of coming back at a random time to be refused again: each refusal is a claim, a row load
and a write, and with random retries most of a saturated server's claims were refusals. Callers
that name no holder (a follow-up, a call a person waits on, the door before a server has a row)
stand outside the line, as before: they take a token when there is one. The line holds no token
for anyone (a slot is a time, not a reservation), so it can never let a request through above
the cap; a holder that finds no token at its slot goes to the end of the line again.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Protocol

from django.conf import settings

# Per-second counters only need to live until their second is over; a little slack for clock skew.
SECOND_COUNTER_TTL_SECONDS = 10
# A bucket idle this long has refilled anyway; letting Redis drop it keeps the keyspace small.
BUCKET_TTL_SECONDS = 3600
# A holder that has not come back this long after its slot was served some other way (its row
# ended, or was cancelled): its slot is forgotten, and if it does ask again it is a newcomer.
SLOT_FORGET_SECONDS = 300.0
# The embedded bucket looks for such slots this often, not on every take: the walk over every
# slot is O(waiting), and a slot kept a minute too long only costs its few bytes.
SLOT_SWEEP_SECONDS = 60.0
# A holder this close before its slot is at its slot: slots are float sums (and Redis keeps 14
# digits), and a holder's turn never admits a request on its own (the token must be there too).
SLOT_TOLERANCE_SECONDS = 0.001

@dataclass(frozen=True)
class Take:
    """The answer of one take: granted, or how long until a token and how many were refused."""

    granted: bool
    wait_s: float = 0.0
    # Refusals in the current second (this one included): callers spread their retries over the
    # time the bucket needs to serve them all, instead of all coming back at the same instant.
    refused_this_second: int = 0
    # The refused holder has a slot in the line (see the module doc) `wait_s` from now: it comes
    # back exactly then, with no spread of its own.
    queued: bool = False
    # A grant handed out from this process's prefetched grants (toolops.qps_redis): the
    # time.monotonic() taken just before the take that brought it, from which its send deadline
    # counts. None: the grant came from this take itself.
    asked_at: float | None = None


@dataclass
class BucketStats:
    total: int = 0
    denied: int = 0
    # Grants given up past their send deadline (never sent; not in `total` or `by_purpose`).
    abandoned: int = 0
    peak_in_one_second: int = 0
    peak_at_epoch_second: int | None = None
    by_purpose: dict[str, int] = field(default_factory=dict)
    # Grants a process took ahead of its requests (toolops.qps_redis) and has not yet reported
    # sent (then in `total`) or unused (then in `abandoned`); in the peak from their grant on.
    prefetched: int = 0


class TokenBucket(Protocol):
    def take(self, *, key: str, rate: float, purpose: str, holder: str | None = None) -> Take:
        """One token, or a refusal naming when to come back; `holder` (an operation id) queues
        the caller in the line when refused, `None` keeps it outside the line."""
        ...

    def stats(self, *, key: str) -> BucketStats: ...

    def reset(self, *, key: str) -> None: ...

    def abandon(self, *, key: str, purpose: str) -> None:
        """A grant passed its send deadline unused: it stays spent, but it is no request, so the
        totals (requests sent) drop it and `abandoned` counts it."""
        ...

    def spend(self, *, key: str) -> None:
        """Empty the bucket now without counting a request: requests charged elsewhere just left
        through the same door (the negotiation of a new server), so the next grant waits."""
        ...

    def report_all(self) -> None:
        """Report the grants this process took ahead of its requests (sent, or given up now):
        before the process ends, so the counters hold them."""
        ...


# How far ahead of its even slot a grant may come (see the module doc, "the horizon"): at 1 ms,
# only caps of 1,000 requests a second and more see a bucket larger than one token, and the
# arrivals move by at most 1 ms, a hundredth of the default wire allowance.
PREFETCH_HORIZON_SECONDS = 0.001


def qps_burst() -> float:
    return float(getattr(settings, "TOOLOPS_QPS_BURST", 1.0))


def qps_capacity(*, rate: float) -> float:
    """The bucket's capacity at refill `rate`: the configured burst, or the grants of the next
    PREFETCH_HORIZON_SECONDS when that is more (rates of 1,000/s and up)."""
    return max(qps_burst(), float(math.floor(1.0 + rate * PREFETCH_HORIZON_SECONDS)))


def qps_prefetch_max() -> int:
    """Most grants one take of the fleet bucket may bring back to its process (1: none ahead)."""
    return max(int(getattr(settings, "TOOLOPS_QPS_PREFETCH", 8)), 1)


def send_deadline_seconds() -> float:
    """A grant older than this when its request is about to leave is not used (see the module doc)."""
    return float(getattr(settings, "TOOLOPS_QPS_SEND_DEADLINE_SECONDS", 0.05))


def wire_allowance_seconds() -> float:
    """The margin between grants: the send deadline, the horizon a grant may come early by, and
    the gate-to-server latency they leave room for."""
    return max(float(getattr(settings, "TOOLOPS_QPS_WIRE_ALLOWANCE_SECONDS", 0.1)),
               send_deadline_seconds() + PREFETCH_HORIZON_SECONDS)


def wire_rate(*, cap: float) -> float:
    """The refill rate that keeps every sliding second of ARRIVALS at or under `cap`."""
    n = max(1, math.floor(cap))
    interval = max(1.0 / cap, (1.0 + wire_allowance_seconds()) / n)
    return 1.0 / interval


class LocalTokenBucket:
    """The embedded bucket: the same algorithm in memory (one process is the whole fleet)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}
        self._stats: dict[str, BucketStats] = {}
        self._seconds: dict[str, tuple[int, int, int]] = {}  # key -> (second, granted, refused)
        # key -> (the last slot handed out, less the shift then; the shift: how far outside
        # grants have pushed the line back). A slot is stored the same way: its time is the
        # stored value plus the current shift, so one push moves every waiting holder at once.
        self._lines: dict[str, tuple[float, float]] = {}
        # key -> holder -> its slot, less the shift when it was given (as the line above).
        self._slots: dict[str, dict[str, float]] = {}
        self._next_forget = 0.0

    def take(self, *, key: str, rate: float, purpose: str, holder: str | None = None) -> Take:
        wall = time.time()
        sec = int(wall)
        burst = qps_capacity(rate=rate)
        with self._lock:
            tokens, ts = self._buckets.get(key, (burst, wall))
            if wall > ts:
                tokens, ts = min(burst, tokens + (wall - ts) * rate), wall
            stats = self._stats.setdefault(key, BucketStats())
            second, granted, refused = self._seconds.get(key, (sec, 0, 0))
            if second != sec:
                second, granted, refused = sec, 0, 0
            self._forget_old_slots(wall=wall)
            line_base, shift = self._lines.get(key, (0.0, 0.0))
            line = line_base + shift
            wait: float | None = None
            if holder is None:
                grant = tokens >= 1
                if grant and line > wall:
                    # A token the line was counting on: everyone waiting moves back by one.
                    shift += 1.0 / rate
            else:
                slots = self._slots.setdefault(key, {})
                base = slots.get(holder)
                if base is not None:
                    grant = wall >= base + shift - SLOT_TOLERANCE_SECONDS and tokens >= 1
                    if grant:
                        del slots[holder]
                    else:
                        # Not its turn yet, or its turn and the token not back yet: it keeps
                        # its place (first in line once its slot has passed).
                        wait = max(base + shift - wall, max(1.0 - tokens, 0.0) / rate)
                else:
                    grant = tokens >= 1 and line <= wall
                    if not grant:
                        slot = max(wall + max(1.0 - tokens, 0.0) / rate, line + 1.0 / rate)
                        slots[holder] = line_base = slot - shift
                        wait = slot - wall
            self._lines[key] = (line_base, shift)
            if grant:
                self._buckets[key] = (tokens - 1, ts)
                granted += 1
                self._seconds[key] = (second, granted, refused)
                stats.total += 1
                stats.by_purpose[purpose] = stats.by_purpose.get(purpose, 0) + 1
                if granted > stats.peak_in_one_second:
                    stats.peak_in_one_second, stats.peak_at_epoch_second = granted, sec
                return Take(granted=True)
            self._buckets[key] = (tokens, ts)
            refused += 1
            self._seconds[key] = (second, granted, refused)
            stats.denied += 1
            if wait is not None:
                return Take(granted=False, wait_s=wait, refused_this_second=refused, queued=True)
            return Take(granted=False, wait_s=(1 - tokens) / rate, refused_this_second=refused)

    def _forget_old_slots(self, *, wall: float) -> None:
        """Drop the slots of holders that never came back (SLOT_FORGET_SECONDS)."""
        if wall < self._next_forget:
            return
        self._next_forget = wall + SLOT_SWEEP_SECONDS
        for key, slots in self._slots.items():
            shift = self._lines.get(key, (0.0, 0.0))[1]
            for holder in [h for h, at in slots.items() if at + shift < wall - SLOT_FORGET_SECONDS]:
                del slots[holder]

    def stats(self, *, key: str) -> BucketStats:
        with self._lock:
            s = self._stats.get(key, BucketStats())
            return BucketStats(total=s.total, denied=s.denied, abandoned=s.abandoned,
                               peak_in_one_second=s.peak_in_one_second,
                               peak_at_epoch_second=s.peak_at_epoch_second,
                               by_purpose=dict(s.by_purpose))

    def stats_load(self, *, key: str, stats: BucketStats) -> None:
        """Counts taken elsewhere (another process's embedded bucket), to be reported from here."""
        with self._lock:
            self._stats[key] = BucketStats(**{**asdict(stats), "by_purpose": dict(stats.by_purpose)})

    def reset(self, *, key: str) -> None:
        with self._lock:
            for store in (self._buckets, self._stats, self._seconds, self._lines, self._slots):
                store.pop(key, None)

    def abandon(self, *, key: str, purpose: str) -> None:
        with self._lock:
            stats = self._stats.setdefault(key, BucketStats())
            stats.total -= 1
            stats.by_purpose[purpose] = stats.by_purpose.get(purpose, 0) - 1
            stats.abandoned += 1

    def spend(self, *, key: str) -> None:
        with self._lock:
            self._buckets[key] = (0.0, time.time())

    def report_all(self) -> None:
        """Nothing to report: the embedded bucket grants one token per take."""


_bucket_lock = threading.Lock()
_bucket: TokenBucket | None = None


def qps_backend_name() -> str:
    """`redis` for a fleet, `local` for the embedded runner (SQLite means embedded by default)."""
    configured = str(getattr(settings, "TOOLOPS_QPS_BACKEND", "") or "")
    if configured:
        return configured
    engine = settings.DATABASES["default"]["ENGINE"]
    return "local" if engine.endswith("sqlite3") else "redis"


def qps_bucket() -> TokenBucket:
    """The process-wide bucket (created on first use)."""
    global _bucket
    with _bucket_lock:
        if _bucket is None:
            name = qps_backend_name()
            if name == "redis":
                from toolops.qps_redis import RedisTokenBucket

                url = str(getattr(settings, "TOOLOPS_QPS_REDIS_URL", "") or settings.CELERY_BROKER_URL)
                _bucket = RedisTokenBucket(url=url)
            elif name == "local":
                _bucket = LocalTokenBucket()
            else:
                raise ValueError(f"TOOLOPS_QPS_BACKEND must be 'redis' or 'local', not {name!r}")
        return _bucket


def qps_bucket_report() -> None:
    """A process about to end reports the grants it took ahead (if it ever made its bucket)."""
    with _bucket_lock:
        bucket = _bucket
    if bucket is not None:
        bucket.report_all()


def qps_bucket_replace(bucket: TokenBucket | None) -> None:
    """Swap the process bucket (the benchmark and tests pick a backend explicitly)."""
    global _bucket
    with _bucket_lock:
        _bucket = bucket


def _namespace() -> str:
    """Buckets are namespaced by ledger database: server ids are per database, and two ledgers (a
    test run and a benchmark, two deployments) sharing one Redis must not share buckets."""
    namespace = str(getattr(settings, "TOOLOPS_QPS_NAMESPACE", "") or "")
    if not namespace:
        db = settings.DATABASES["default"]
        namespace = f"{db.get('HOST') or 'local'}:{db.get('PORT') or ''}:{db['NAME']}"
    return namespace


def server_bucket_key(*, server_id: int) -> str:
    return f"{_namespace()}:server:{server_id}"


def door_bucket_key(*, url: str) -> str:
    """A bucket for a server's door before it has a row: the negotiation at `server-add`."""
    return f"{_namespace()}:door:{url}"


def retry_spread_seconds(*, take: Take, rate: float) -> float:
    """How far to spread the retries of refused callers: the time the bucket needs to serve them."""
    return max(take.wait_s, math.ceil(max(take.refused_this_second, 1)) / rate)
