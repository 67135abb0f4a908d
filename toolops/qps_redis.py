"""The fleet's QPS bucket: one Redis Lua script per take (the algorithm is in toolops.qps).

The refill, the take, the line of refused holders and the request counters of one server are one
atomic script, so no two worker processes can read-modify-write them apart. The script reads the
clock with Redis `TIME`, so workers with skewed clocks share one time line.
"""

from __future__ import annotations

import atexit
from typing import Any

from toolops.qps import (
    BUCKET_TTL_SECONDS,
    SECOND_COUNTER_TTL_SECONDS,
    SLOT_FORGET_SECONDS,
    SLOT_TOLERANCE_SECONDS,
    BucketStats,
    Take,
    qps_burst,
)

# KEYS: bucket hash (tokens, ts, line, shift: see LocalTokenBucket), stats hash, per-second
# grant prefix, per-second refusal prefix, the line's slots (a sorted set: holder -> slot time
# less the shift when it was given).
# ARGV: rate, burst, purpose, bucket ttl, second-counter ttl, holder ('' = outside the line),
# slot forget seconds, slot tolerance seconds. Returns {granted, wait, refused this second, queued}.
_TAKE_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local sec = t[1]
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local holder = ARGV[6]
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts', 'line', 'shift')
local tokens = tonumber(b[1])
local ts = tonumber(b[2])
local line_base = tonumber(b[3]) or 0
local shift = tonumber(b[4]) or 0
if tokens == nil or ts == nil then
  tokens = burst
  ts = now
end
if now > ts then
  tokens = math.min(burst, tokens + (now - ts) * rate)
  ts = now
end
local line = line_base + shift
local grant = false
local wait = nil
if holder == '' then
  grant = tokens >= 1
  if grant and line > now then
    shift = shift + 1 / rate
  end
else
  local base = tonumber(redis.call('ZSCORE', KEYS[5], holder) or nil)
  if base ~= nil then
    grant = now >= base + shift - tonumber(ARGV[8]) and tokens >= 1
    if grant then
      redis.call('ZREM', KEYS[5], holder)
    else
      wait = math.max(base + shift - now, math.max(1 - tokens, 0) / rate)
    end
  else
    grant = tokens >= 1 and line <= now
    if not grant then
      local slot = math.max(now + math.max(1 - tokens, 0) / rate, line + 1 / rate)
      line_base = slot - shift
      -- Forgotten slots are swept only when someone joins: a poll that finds no line (the
      -- usual case while the cap does not bind) pays one ZSCORE, not a range scan.
      redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', tostring(now - tonumber(ARGV[7]) - shift))
      redis.call('ZADD', KEYS[5], tostring(line_base), holder)
      redis.call('EXPIRE', KEYS[5], tonumber(ARGV[4]))
      wait = slot - now
    end
  end
end
if grant then
  tokens = tokens - 1
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(ts),
           'line', tostring(line_base), 'shift', tostring(shift))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
if grant then
  local ck = KEYS[3] .. sec
  local c = redis.call('INCR', ck)
  redis.call('EXPIRE', ck, tonumber(ARGV[5]))
  redis.call('HINCRBY', KEYS[2], 'total', 1)
  redis.call('HINCRBY', KEYS[2], 'purpose:' .. ARGV[3], 1)
  local peak = tonumber(redis.call('HGET', KEYS[2], 'peak') or '0')
  if c > peak then
    redis.call('HSET', KEYS[2], 'peak', c, 'peak_at', sec)
  end
  return {1, '0', '0', 0}
end
local dk = KEYS[4] .. sec
local d = redis.call('INCR', dk)
redis.call('EXPIRE', dk, tonumber(ARGV[5]))
redis.call('HINCRBY', KEYS[2], 'denied', 1)
if wait ~= nil then
  return {0, tostring(wait), tostring(d), 1}
end
return {0, tostring((1 - tokens) / rate), tostring(d), 0}
"""


_SPEND_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('HSET', KEYS[1], 'tokens', '0', 'ts', tostring(now))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
return 1
"""


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
        return [f"{base}:bucket", f"{base}:stats", f"{base}:sec:", f"{base}:denied:",
                f"{base}:line"]

    def take(self, *, key: str, rate: float, purpose: str, holder: str | None = None) -> Take:
        granted, wait, refused, queued = self._script(
            keys=self._keys(key),
            args=[repr(float(rate)), repr(qps_burst()), purpose, BUCKET_TTL_SECONDS,
                  SECOND_COUNTER_TTL_SECONDS, holder or "", repr(SLOT_FORGET_SECONDS),
                  repr(SLOT_TOLERANCE_SECONDS)],
        )
        return Take(granted=bool(int(granted)), wait_s=float(wait), refused_this_second=int(refused),
                    queued=bool(int(queued)))

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
        bucket, stats, _, _, line = self._keys(key)
        self._redis.delete(bucket, stats, line)

    def abandon(self, *, key: str, purpose: str) -> None:
        stats = self._keys(key)[1]
        pipe = self._redis.pipeline()
        pipe.hincrby(stats, "total", -1)
        pipe.hincrby(stats, f"purpose:{purpose}", -1)
        pipe.hincrby(stats, "abandoned", 1)
        pipe.execute()

    def spend(self, *, key: str) -> None:
        self._spend_script(keys=self._keys(key)[:1], args=[BUCKET_TTL_SECONDS])
