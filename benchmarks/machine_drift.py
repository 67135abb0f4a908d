"""Benchmark (not a test): how steady is this machine's CPU, minute to minute, with a fixed load?

The perf harness compares toolops with naive Celery in bursts run one after the other, a minute
or so apart, and reads ratios of their calls/s and CPU per call (README, "Performance"). That
comparison holds only if the machine does the same work at the same speed from one burst to the
next. This runs the same fixed piece of pure-Python work in a loop in one process per core, for
`--seconds`, and counts how many pieces each `--window` of seconds completed across all
processes. Nothing else of the project runs, so a change in the rate is the machine's (the host
handing out less CPU, other guests, frequency), not the code's.

Prints one line per window (pieces per second, and against the run's median) and then one JSON
line: the median, the slowest and fastest windows against it, and the CPU the kernel reports as
stolen by the host over the run (`/proc/stat`; a hypervisor that does not report it shows 0).

Run it on an otherwise idle machine, before or between full runs:
    .venv/bin/python benchmarks/machine_drift.py --seconds 180 --window 10
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time

# One piece is about a millisecond of interpreter work on the project's machines: short enough
# that a window of seconds holds thousands, long enough that the loop's clock reads cost little.
PIECE_ITERATIONS = 20_000


def _piece() -> int:
    total = 0
    for i in range(PIECE_ITERATIONS):
        total += i * i % 7
    return total


def _worker(start: float, seconds: float, window: float, out: mp.Queue) -> None:
    # Every process counts from the same start, after all of them exist, so that a window holds
    # the same stretch of time in each and no process's start-up falls inside the first.
    time.sleep(max(0.0, start - time.monotonic()))
    deadline = start + seconds
    counts: dict[int, int] = {}
    while time.monotonic() < deadline:
        _piece()
        slot = int((time.monotonic() - start) // window)
        counts[slot] = counts.get(slot, 0) + 1
    out.put(counts)


def _steal_jiffies() -> int | None:
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal ...
    return int(fields[8]) if len(fields) > 8 else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    # A window must hold many pieces (about a millisecond each) for its rate to mean anything.
    if args.window < 1 or args.window > args.seconds or args.procs < 1:
        parser.error("need 1 <= --window <= --seconds and --procs >= 1")

    out: mp.Queue = mp.Queue()
    # Half a second is ample for the processes to start (fork) before the common start.
    start = time.monotonic() + 0.5
    procs = [
        mp.Process(target=_worker, args=(start, args.seconds, args.window, out)) for _ in range(args.procs)
    ]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start - time.monotonic()))
    steal0, wall0 = _steal_jiffies(), time.monotonic()
    totals: dict[int, int] = {}
    for _ in procs:
        for slot, n in out.get().items():
            totals[slot] = totals.get(slot, 0) + n
    for p in procs:
        p.join()
    steal1, wall = _steal_jiffies(), time.monotonic() - wall0

    # Only whole windows are compared (a last one cut short by the end is left out). A window in
    # which no piece ended (the machine stalled for all of it) counts as a rate of 0.
    rates = [totals.get(slot, 0) / args.window for slot in range(int(args.seconds // args.window))]
    median = statistics.median(rates)
    if median == 0:
        raise SystemExit("no piece ended in most windows: the machine did no work to compare")
    for slot, rate in enumerate(rates):
        print(f"{slot * args.window:7.0f} s  {rate:8.1f} pieces/s  x{rate / median:.3f} of the median")
    ticks = os.sysconf("SC_CLK_TCK")
    steal_s = (steal1 - steal0) / ticks if steal0 is not None and steal1 is not None else None
    print(
        json.dumps(
            {
                "procs": args.procs,
                "seconds": args.seconds,
                "window_s": args.window,
                "windows": len(rates),
                "median_pieces_per_s": round(median, 1),
                "slowest_vs_median": round(min(rates) / median, 3),
                "fastest_vs_median": round(max(rates) / median, 3),
                "fastest_vs_slowest": round(max(rates) / min(rates), 3) if min(rates) else None,
                "steal_share": round(steal_s / (wall * args.procs), 4) if steal_s is not None else None,
            }
        )
    )


if __name__ == "__main__":
    main()
