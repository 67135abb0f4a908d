"""Benchmark (not a test): what one QPS token costs, with and without prefetched grants.

Takes `--takes` tokens back to back from the fleet bucket (`toolops.qps_redis.RedisTokenBucket`,
a real Redis) at a cap no rate here reaches (the perf harness's 100,000/s), alternating purposes
as a worker does (`poll`, `result`), once with TOOLOPS_QPS_PREFETCH=1 (a script call per token,
as before prefetching) and once with the default, in `--rounds` alternating rounds. Prints, per
token, this process's CPU, the Redis server's CPU (read from /proc: meaningful with Redis on this
machine and otherwise idle), the wall time, the script calls, and the grants given up unused.

    .venv/bin/python benchmarks/qps_take.py [--redis redis://127.0.0.1:6379/7]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.test import override_settings  # noqa: E402

from toolops.qps import wire_rate  # noqa: E402
from toolops.qps_redis import RedisTokenBucket  # noqa: E402

CAP = 100000.0


def _redis_cpu_seconds() -> float:
    """CPU of the local redis-server processes so far (0 when none is found)."""
    try:
        pids = subprocess.run(["pgrep", "-x", "redis-server"], capture_output=True, text=True,
                              check=False).stdout.split()
    except FileNotFoundError:
        return 0.0
    total = 0.0
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _round(*, url: str, takes: int, prefetch: int) -> dict[str, float]:
    with override_settings(TOOLOPS_QPS_PREFETCH=prefetch):
        bucket = RedisTokenBucket(url=url)
        calls = 0
        script = bucket._script

        def counted(**kwargs: object) -> object:
            nonlocal calls
            calls += 1
            return script(**kwargs)

        bucket._script = counted
        key = f"bench:qps-take:{uuid.uuid4().hex}"
        rate = wire_rate(cap=CAP)
        redis0, cpu0, wall0 = _redis_cpu_seconds(), time.process_time(), time.perf_counter()
        for i in range(takes):
            bucket.take(key=key, rate=rate, purpose="result" if i % 2 else "poll")
        cpu1, wall1 = time.process_time(), time.perf_counter()
        bucket.report_all()
        redis1 = _redis_cpu_seconds()
        stats = bucket.stats(key=key)
        bucket.reset(key=key)
    if stats.total != takes:
        raise SystemExit(f"counted {stats.total} requests for {takes} takes")
    return {"cpu_us": 1e6 * (cpu1 - cpu0) / takes, "redis_us": 1e6 * (redis1 - redis0) / takes,
            "wall_us": 1e6 * (wall1 - wall0) / takes, "calls": calls / takes,
            "unused": stats.abandoned / takes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--takes", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    default = int(settings.TOOLOPS_QPS_PREFETCH)
    for n in range(args.rounds):
        for prefetch in (1, default):
            r = _round(url=args.redis, takes=args.takes, prefetch=prefetch)
            print(f"round {n + 1}, TOOLOPS_QPS_PREFETCH={prefetch}: {r['cpu_us']:.1f} us CPU here, "
                  f"{r['redis_us']:.1f} us in Redis, {r['wall_us']:.1f} us wall per token; "
                  f"{r['calls']:.3f} script calls per token, {r['unused']:.3f} unused")


if __name__ == "__main__":
    main()
