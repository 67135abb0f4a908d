"""The fleet's QPS bucket: one Redis Lua script per take (the algorithm is in toolops.qps).

The refill, the take, the line of refused holders and the request counters of one server are one
atomic script, so no two worker processes can read-modify-write them apart. The script reads the
clock with Redis `TIME`, so workers with skewed clocks share one time line.

Prefetched grants. At caps of 1,000 requests a second and more the bucket holds the grants of the
next millisecond (toolops.qps, "the horizon"), and a take may ask for several: as many as this
process took for the same server within the last send deadline, up to TOOLOPS_QPS_PREFETCH. The
script grants them only while nobody waits in the line, and only tokens that are in the bucket;
the caller's own is used at once, the others wait in the process and go to its next takes for the
same server, each only within the send deadline of the take that brought it (older ones are
abandoned: spent, never sent). So a worker polling hundreds of rows a second of one fast server
makes a Redis round trip for a few requests instead of each; below 1,000/s nothing changes.

Their counts: the script counts every grant in the second it is granted (the peak is never
under-counted), and counts the caller's own in `total` and its purpose at once. A prefetched
grant is counted `prefetched` until the process reports it with its next take (or when it reads
the stats, or exits): sent, under the purpose it was used for, or abandoned. So `total` and the
purposes are exact for what has been reported, and `prefetched` says how many grants are still
out in processes (at most TOOLOPS_QPS_PREFETCH - 1 per process and server).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections import Counter, deque
from typing import Any

from toolops.qps import (
    BUCKET_TTL_SECONDS,
    SECOND_COUNTER_TTL_SECONDS,
    SLOT_FORGET_SECONDS,
    SLOT_TOLERANCE_SECONDS,
    BucketStats,
    Take,
    qps_capacity,
    qps_prefetch_max,
    send_deadline_seconds,
)

# The report of prefetched grants a take carries (ARGV[10]): "purpose count" pairs, separated by
# spaces, for grants sent; the pseudo-purpose below for grants that passed their deadline unused.
_UNUSED = "~unused"
_EPOCH_LUA = """
-- An epoch time as text to the microsecond, Redis TIME's resolution. tostring keeps 14
-- significant digits, a tenth of a millisecond at today's epoch: the rounding of each stored
-- refill time, added up over the takes of a few seconds at 2,700 grants a second, let a fleet
-- take a few grants more than its cap allows.
local function epoch(x)
  return string.format('%.6f', x)
end
"""
_REPORT_LUA = _EPOCH_LUA + """
local function report(stats, text)
  local name = nil
  for word in string.gmatch(text, '%S+') do
    if name == nil then
      name = word
    else
      local n = tonumber(word)
      if name == '""" + _UNUSED + """' then
        redis.call('HINCRBY', stats, 'abandoned', n)
      else
        redis.call('HINCRBY', stats, 'total', n)
        redis.call('HINCRBY', stats, 'purpose:' .. name, n)
      end
      redis.call('HINCRBY', stats, 'prefetched', -n)
      name = nil
    end
  end
end
"""

# KEYS: bucket hash (tokens, ts, line, shift: see LocalTokenBucket), stats hash, per-second
# grant prefix, per-second refusal prefix, the line's slots (a sorted set: holder -> slot time
# less the shift when it was given).
# ARGV: rate, capacity, purpose, bucket ttl, second-counter ttl, holder ('' = outside the line),
# slot forget seconds, slot tolerance seconds, grants wanted (>= 1), the report of prefetched
# grants. Returns {granted, wait, refused this second, queued, grants}.
_TAKE_SCRIPT = _REPORT_LUA + """
report(KEYS[2], ARGV[10])
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
      redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', epoch(now - tonumber(ARGV[7]) - shift))
      redis.call('ZADD', KEYS[5], epoch(line_base), holder)
      redis.call('EXPIRE', KEYS[5], tonumber(ARGV[4]))
      wait = slot - now
    end
  end
end
local n = 0
if grant then
  n = 1
  -- More grants for the caller's process only from tokens in the bucket, and only while nobody
  -- waits in the line: a prefetch never takes a token a refused holder was promised.
  if tonumber(ARGV[9]) > 1 and line_base + shift <= now then
    n = math.max(1, math.min(tonumber(ARGV[9]), math.floor(tokens)))
  end
  tokens = tokens - n
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', epoch(ts),
           'line', epoch(line_base), 'shift', tostring(shift))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
if grant then
  local ck = KEYS[3] .. sec
  local c = redis.call('INCRBY', ck, n)
  redis.call('EXPIRE', ck, tonumber(ARGV[5]))
  redis.call('HINCRBY', KEYS[2], 'total', 1)
  redis.call('HINCRBY', KEYS[2], 'purpose:' .. ARGV[3], 1)
  if n > 1 then
    redis.call('HINCRBY', KEYS[2], 'prefetched', n - 1)
  end
  local peak = tonumber(redis.call('HGET', KEYS[2], 'peak') or '0')
  if c > peak then
    redis.call('HSET', KEYS[2], 'peak', c, 'peak_at', sec)
  end
  return {1, '0', '0', 0, n}
end
local dk = KEYS[4] .. sec
local d = redis.call('INCR', dk)
redis.call('EXPIRE', dk, tonumber(ARGV[5]))
redis.call('HINCRBY', KEYS[2], 'denied', 1)
if wait ~= nil then
  return {0, tostring(wait), tostring(d), 1, 0}
end
return {0, tostring((1 - tokens) / rate), tostring(d), 0, 0}
"""

# KEYS: stats hash. ARGV: the report of prefetched grants (as for a take), nothing taken.
_REPORT_SCRIPT = _REPORT_LUA + """
report(KEYS[1], ARGV[1])
return 1
"""


_SPEND_SCRIPT = _EPOCH_LUA + """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('HSET', KEYS[1], 'tokens', '0', 'ts', epoch(now))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]))
return 1
"""


class _Prefetched:
    """One server's grants this process took ahead of its requests, and what to report of them."""

    __slots__ = ("grants", "recent", "sent", "unused")

    def __init__(self, *, recent: int) -> None:
        # time.monotonic() just before the take that brought each grant, oldest first.
        self.grants: deque[float] = deque()
        # When this process's latest takes for the server were asked: the demand the next
        # prefetch is sized by.
        self.recent: deque[float] = deque(maxlen=recent)
        self.sent: Counter[str] = Counter()
        self.unused = 0

    def report(self) -> str:
        """The counts not yet reported, as the scripts read them; cleared here."""
        words = [f"{purpose} {n}" for purpose, n in self.sent.items() if n]
        if self.unused:
            words.append(f"{_UNUSED} {self.unused}")
        self.sent.clear()
        self.unused = 0
        return " ".join(words)

    def restore(self, text: str) -> None:
        """A report that did not reach Redis: counted again for the next one."""
        words = text.split()
        for name, n in zip(words[::2], words[1::2], strict=True):
            if name == _UNUSED:
                self.unused += int(n)
            else:
                self.sent[name] += int(n)


class RedisTokenBucket:
    """The fleet bucket: one atomic script per take, or none for a prefetched grant."""

    def __init__(self, *, url: str, prefix: str = "toolops:qps") -> None:
        import redis

        self._redis: Any = redis.Redis.from_url(url)
        # Close the pool while the interpreter is still whole: redis-py's __del__ at shutdown
        # runs after `os` is torn down and prints a spurious traceback.
        atexit.register(self._shutdown)
        self._script: Any = self._redis.register_script(_TAKE_SCRIPT)
        self._spend_script: Any = self._redis.register_script(_SPEND_SCRIPT)
        self._report_script: Any = self._redis.register_script(_REPORT_SCRIPT)
        self._prefix = prefix
        # Per bucket key; the poll threads of one worker process share them.
        self._lock = threading.Lock()
        self._prefetched: dict[str, _Prefetched] = {}
        self._pid = os.getpid()

    def _shutdown(self) -> None:
        # Report what this process still holds (it is never sent now), then drop every
        # reference (the script holds the client too) so the client is collected now, not by its
        # __del__ during interpreter teardown.
        try:
            self.report_all()
        except Exception:  # Redis gone at exit: the counts stay `prefetched`, nothing else
            pass
        self._redis.close()
        self._script = None
        self._spend_script = None
        self._report_script = None
        self._redis = None

    def _keys(self, key: str) -> list[str]:
        base = f"{self._prefix}:{key}"
        return [f"{base}:bucket", f"{base}:stats", f"{base}:sec:", f"{base}:denied:",
                f"{base}:line"]

    def _forked(self) -> None:
        # A child of a process that used this bucket: the grants it inherited are the parent's
        # (sending them here would spend them twice), and so is the lock's state.
        self._lock = threading.Lock()
        self._prefetched = {}
        self._pid = os.getpid()

    def take(self, *, key: str, rate: float, purpose: str, holder: str | None = None) -> Take:
        if self._pid != os.getpid():
            self._forked()
        deadline = send_deadline_seconds()
        now = time.monotonic()
        with self._lock:
            held = self._prefetched.get(key)
            if held is None:
                held = self._prefetched[key] = _Prefetched(recent=qps_prefetch_max())
            held.recent.append(now)
            while held.grants and now - held.grants[0] > deadline:
                held.grants.popleft()
                held.unused += 1
            if held.grants:
                held.sent[purpose] += 1
                return Take(granted=True, asked_at=held.grants.popleft())
            # As many as this process asked for within the last deadline: what it would use.
            want = sum(1 for at in held.recent if now - at <= deadline)
            report = held.report()
        asked_at = time.monotonic()
        try:
            granted, wait, refused, queued, grants = self._script(
                keys=self._keys(key),
                args=[repr(float(rate)), repr(qps_capacity(rate=rate)), purpose, BUCKET_TTL_SECONDS,
                      SECOND_COUNTER_TTL_SECONDS, holder or "", repr(SLOT_FORGET_SECONDS),
                      repr(SLOT_TOLERANCE_SECONDS), want, report],
            )
        except BaseException:
            with self._lock:
                held.restore(report)
            raise
        if int(grants) > 1:
            with self._lock:
                held.grants.extend([asked_at] * (int(grants) - 1))
        return Take(granted=bool(int(granted)), wait_s=float(wait), refused_this_second=int(refused),
                    queued=bool(int(queued)))

    def report_all(self) -> None:
        """Report every server's prefetched grants this process has sent, or holds unused (given
        up now: they are never sent after this)."""
        if self._pid != os.getpid():
            return  # the parent's grants, reported by the parent
        with self._lock:
            reports = []
            for key, held in self._prefetched.items():
                held.unused += len(held.grants)
                held.grants.clear()
                reports.append((key, held.report()))
        for key, report in reports:
            if report:
                self._report(key=key, report=report)

    def _report(self, *, key: str, report: str) -> None:
        try:
            self._report_script(keys=[self._keys(key)[1]], args=[report])
        except BaseException:
            with self._lock:
                held = self._prefetched.get(key)
                if held is not None:
                    held.restore(report)
            raise

    def stats(self, *, key: str) -> BucketStats:
        # What this process has sent from prefetched grants is reported first, so a process
        # reading its own figures sees its own requests.
        with self._lock:
            held = self._prefetched.get(key)
            report = held.report() if held is not None else ""
        if report:
            self._report(key=key, report=report)
        raw = {k.decode(): v.decode() for k, v in self._redis.hgetall(self._keys(key)[1]).items()}
        return BucketStats(
            total=int(raw.get("total", 0)),
            denied=int(raw.get("denied", 0)),
            abandoned=int(raw.get("abandoned", 0)),
            peak_in_one_second=int(raw.get("peak", 0)),
            peak_at_epoch_second=int(raw["peak_at"]) if "peak_at" in raw else None,
            by_purpose={k.split(":", 1)[1]: int(v) for k, v in raw.items()
                        if k.startswith("purpose:")},
            prefetched=int(raw.get("prefetched", 0)),
        )

    def reset(self, *, key: str) -> None:
        bucket, stats, _, _, line = self._keys(key)
        with self._lock:
            # The counters start afresh: nothing taken before is reported into them.
            self._prefetched.pop(key, None)
        self._redis.delete(bucket, stats, line)

    def abandon(self, *, key: str, purpose: str) -> None:
        stats = self._keys(key)[1]
        pipe = self._redis.pipeline()
        pipe.hincrby(stats, "total", -1)
        pipe.hincrby(stats, f"purpose:{purpose}", -1)
        pipe.hincrby(stats, "abandoned", 1)
        pipe.execute()

    def spend(self, *, key: str) -> None:
        # Grants this process holds for the key are given up too: the next request waits.
        with self._lock:
            held = self._prefetched.get(key)
            if held is not None:
                held.unused += len(held.grants)
                held.grants.clear()
        self._spend_script(keys=self._keys(key)[:1], args=[BUCKET_TTL_SECONDS])
