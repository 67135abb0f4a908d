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

The observed-rate figures (total, per purpose, peak in one second) are counted by the same script
in Redis, not in a SQL table: a row per request would add one INSERT to every poll (the hottest
path), while an INCR inside the script we already run costs no extra round trip. The peak is kept
as a running maximum over calendar seconds, so the report reads three small keys per server.
"""

from __future__ import annotations

import atexit
import math
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from django.conf import settings

# Per-second counters only need to live until their second is over; a little slack for clock skew.
SECOND_COUNTER_TTL_SECONDS = 10
# A bucket idle this long has refilled anyway; letting Redis drop it keeps the keyspace small.
BUCKET_TTL_SECONDS = 3600

_TAKE_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local sec = t[1]
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1])
local ts = tonumber(b[2])
if tokens == nil or ts == nil then
  tokens = burst
  ts = now
end
if now > ts then
  tokens = math.min(burst, tokens + (now - ts) * rate)
  ts = now
end
if tokens >= 1 then
  tokens = tokens - 1
  redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(ts))
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
  local ck = KEYS[3] .. sec
  local c = redis.call('INCR', ck)
  redis.call('EXPIRE', ck, tonumber(ARGV[5]))
  redis.call('HINCRBY', KEYS[2], 'total', 1)
  redis.call('HINCRBY', KEYS[2], 'purpose:' .. ARGV[3], 1)
  local peak = tonumber(redis.call('HGET', KEYS[2], 'peak') or '0')
  if c > peak then
    redis.call('HSET', KEYS[2], 'peak', c, 'peak_at', sec)
  end
  return {1, '0', '0'}
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(ts))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
local dk = KEYS[4] .. sec
local d = redis.call('INCR', dk)
redis.call('EXPIRE', dk, tonumber(ARGV[5]))
redis.call('HINCRBY', KEYS[2], 'denied', 1)
return {0, tostring((1 - tokens) / rate), tostring(d)}
"""


_SPEND_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('HSET', KEYS[1], 'tokens', '0', 'ts', tostring(now))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
return 1
"""


@dataclass(frozen=True)
class Take:
    """The answer of one take: granted, or how long until a token and how many were refused."""

    granted: bool
    wait_s: float = 0.0
    # Refusals in the current second (this one included): callers spread their retries over the
    # time the bucket needs to serve them all, instead of all coming back at the same instant.
    refused_this_second: int = 0


@dataclass
class BucketStats:
    total: int = 0
    denied: int = 0
    # Grants given up past their send deadline (never sent; not in `total` or `by_purpose`).
    abandoned: int = 0
    peak_in_one_second: int = 0
    peak_at_epoch_second: int | None = None
    by_purpose: dict[str, int] = field(default_factory=dict)


class TokenBucket(Protocol):
    def take(self, *, key: str, rate: float, purpose: str) -> Take: ...

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


def _burst() -> float:
    return float(getattr(settings, "TOOLOPS_QPS_BURST", 1.0))


def send_deadline_seconds() -> float:
    """A grant older than this when its request is about to leave is not used (see the module doc)."""
    return float(getattr(settings, "TOOLOPS_QPS_SEND_DEADLINE_SECONDS", 0.05))


def wire_allowance_seconds() -> float:
    """The margin between grants: the send deadline plus the gate-to-server latency it allows."""
    return max(float(getattr(settings, "TOOLOPS_QPS_WIRE_ALLOWANCE_SECONDS", 0.1)),
               send_deadline_seconds())


def wire_rate(*, cap: float) -> float:
    """The refill rate that keeps every sliding second of ARRIVALS at or under `cap`."""
    n = max(1, math.floor(cap))
    interval = max(1.0 / cap, (1.0 + wire_allowance_seconds()) / n)
    return 1.0 / interval


class RedisTokenBucket:
    """The fleet bucket: one atomic script per take."""

    def __init__(self, *, url: str, prefix: str = "toolops:qps") -> None:
        import redis

        self._redis: Any = redis.Redis.from_url(url)
        # Close the pool while the interpreter is still whole: redis-py's __del__ at shutdown
        # runs after `os` is torn down and prints a spurious traceback.
        atexit.register(self._shutdown)
        self._script: Any = self._redis.register_script(_TAKE_SCRIPT)
        self._spend_script: Any = self._redis.register_script(_SPEND_SCRIPT)
        self._prefix = prefix

    def _shutdown(self) -> None:
        # Drop every reference (the script holds the client too) so the client is collected now,
        # not by its __del__ during interpreter teardown.
        self._redis.close()
        self._script = None
        self._spend_script = None
        self._redis = None

    def _keys(self, key: str) -> list[str]:
        base = f"{self._prefix}:{key}"
        return [f"{base}:bucket", f"{base}:stats", f"{base}:sec:", f"{base}:denied:"]

    def take(self, *, key: str, rate: float, purpose: str) -> Take:
        granted, wait, refused = self._script(
            keys=self._keys(key),
            args=[repr(float(rate)), repr(_burst()), purpose, BUCKET_TTL_SECONDS,
                  SECOND_COUNTER_TTL_SECONDS],
        )
        return Take(granted=bool(int(granted)), wait_s=float(wait), refused_this_second=int(refused))

    def stats(self, *, key: str) -> BucketStats:
        raw = {k.decode(): v.decode() for k, v in self._redis.hgetall(self._keys(key)[1]).items()}
        return BucketStats(
            total=int(raw.get("total", 0)),
            denied=int(raw.get("denied", 0)),
            abandoned=int(raw.get("abandoned", 0)),
            peak_in_one_second=int(raw.get("peak", 0)),
            peak_at_epoch_second=int(raw["peak_at"]) if "peak_at" in raw else None,
            by_purpose={k.split(":", 1)[1]: int(v) for k, v in raw.items()
                        if k.startswith("purpose:")},
        )

    def reset(self, *, key: str) -> None:
        bucket, stats, _, _ = self._keys(key)
        self._redis.delete(bucket, stats)

    def abandon(self, *, key: str, purpose: str) -> None:
        stats = self._keys(key)[1]
        pipe = self._redis.pipeline()
        pipe.hincrby(stats, "total", -1)
        pipe.hincrby(stats, f"purpose:{purpose}", -1)
        pipe.hincrby(stats, "abandoned", 1)
        pipe.execute()

    def spend(self, *, key: str) -> None:
        self._spend_script(keys=self._keys(key)[:1], args=[BUCKET_TTL_SECONDS])


class LocalTokenBucket:
    """The embedded bucket: the same algorithm in memory (one process is the whole fleet)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}
        self._stats: dict[str, BucketStats] = {}
        self._seconds: dict[str, tuple[int, int, int]] = {}  # key -> (second, granted, refused)

    def take(self, *, key: str, rate: float, purpose: str) -> Take:
        wall = time.time()
        sec = int(wall)
        burst = _burst()
        with self._lock:
            tokens, ts = self._buckets.get(key, (burst, wall))
            if wall > ts:
                tokens, ts = min(burst, tokens + (wall - ts) * rate), wall
            stats = self._stats.setdefault(key, BucketStats())
            second, granted, refused = self._seconds.get(key, (sec, 0, 0))
            if second != sec:
                second, granted, refused = sec, 0, 0
            if tokens >= 1:
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
            return Take(granted=False, wait_s=(1 - tokens) / rate, refused_this_second=refused)

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
            for store in (self._buckets, self._stats, self._seconds):
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
                url = str(getattr(settings, "TOOLOPS_QPS_REDIS_URL", "") or settings.CELERY_BROKER_URL)
                _bucket = RedisTokenBucket(url=url)
            elif name == "local":
                _bucket = LocalTokenBucket()
            else:
                raise ValueError(f"TOOLOPS_QPS_BACKEND must be 'redis' or 'local', not {name!r}")
        return _bucket


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
