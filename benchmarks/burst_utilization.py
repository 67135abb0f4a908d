"""Benchmark (not a test): how busy the box is through a burst, naive Celery beside this project.

A burst's calls/s is N over its wall time, and the wall time is the box's CPU per call times N
over the share of the two cores the run keeps busy. When this project's CPU per call is at or
below naive Celery's and its calls/s is still lower, the difference is in that share: when in
the burst the cores sit idle. This runs the perf harness's own baselines (`baseline_celery.py`,
`baseline_toolops.py`, unchanged) against one fast MCP server it starts and stops, samples the
box's busy fraction (`/proc/stat`, all cores) every 100 ms meanwhile, finds each burst in the
samples (the window of the run's own wall time that holds the most busy time), and prints per
run: calls/s, box CPU per call, and the busy share over the whole burst, its first half second,
its last second and the part between, with the burst's timeline in half-second steps.

    PERF_ENV=/tmp/perf-env TOOLOPS_SERVER_HOSTS=public,127.0.0.0/8 \\
        python benchmarks/burst_utilization.py --n 2000 --rounds 2

Each round runs Celery, then this project (the order flips every other round). Environment
variables given with `--toolops-env NAME=VALUE` reach this project's fleet and submitters only
(for an experiment such as `PGOPTIONS=-c synchronous_commit=off`, never a setting to ship).
Needs the harness set up (`../shared/perf/setup.sh`), Linux, and nothing else on port 8765.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from interleaved_bursts import SERVER_ENV, baseline_runs, fast_server, harness_arguments, run_logged

SAMPLE_S = 0.1
# The parts of a burst reported apart: the first half second (only the submitters have work) and
# the last second (one task's length: only polls are left).
HEAD_S, TAIL_S = 0.5, 1.0


class BusySampler:
    """The box's busy fraction (all cores, from /proc/stat) every SAMPLE_S, on a thread."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []  # (end of the interval, busy fraction)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    def _loop(self) -> None:
        total0, idle0 = self._read()
        while not self._stop.wait(SAMPLE_S):
            total, idle = self._read()
            span = total - total0
            self.samples.append((time.time(), (span - (idle - idle0)) / span if span else 0.0))
            total0, idle0 = total, idle

    def start(self) -> BusySampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def burst(self, *, since: float, until: float, wall_s: float) -> list[float]:
        """The busy fractions of the `wall_s` window between `since` and `until` that holds the
        most busy time: the burst. The harness starts every burst on a quiet box (its runs
        settle 10.5 s before the start), so the busiest window of the run's own length is it."""
        inside = [busy for t, busy in self.samples if since <= t <= until]
        width = max(1, round(wall_s / SAMPLE_S))
        if len(inside) <= width:
            return inside
        best, best_sum = 0, sum(inside[:width])
        running = best_sum
        for i in range(1, len(inside) - width + 1):
            running += inside[i + width - 1] - inside[i - 1]
            if running > best_sum:
                best, best_sum = i, running
        return inside[best:best + width]


def _share(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _report(name: str, run: dict, busy: list[float]) -> dict[str, float]:
    head, tail = round(HEAD_S / SAMPLE_S), round(TAIL_S / SAMPLE_S)
    figures = {"all": _share(busy), "head": _share(busy[:head]), "middle": _share(busy[head:-tail]),
               "tail": _share(busy[-tail:])}
    step = round(0.5 / SAMPLE_S)
    timeline = " ".join(f"{100 * _share(busy[i:i + step]):.0f}" for i in range(0, len(busy), step))
    print(f"  {name}: {run['calls_per_s']} calls/s, wall {run['wall_s']} s, box CPU/call "
          f"{run['box_cpu_ms_per_call']} ms; busy {100 * figures['all']:.0f} % (first {HEAD_S} s "
          f"{100 * figures['head']:.0f} %, middle {100 * figures['middle']:.0f} %, last {TAIL_S} s "
          f"{100 * figures['tail']:.0f} %); by half second: {timeline}", flush=True)
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness_arguments(ap, rounds=1)
    ap.add_argument("--toolops-pool", default="threads")
    ap.add_argument("--toolops-env", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args()

    harness = Path(args.harness)
    python = str(Path(args.perf_env) / "venv" / "bin" / "python")
    env = {**os.environ, **SERVER_ENV, "PERF_ENV": args.perf_env}
    toolops_env = {**env, **dict(item.split("=", 1) for item in args.toolops_env)}
    out = Path(tempfile.mkdtemp(prefix="utilization-"))
    runs = baseline_runs(n=args.n, pools=[args.toolops_pool], submitters=args.submitters)
    shares: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    sampler = BusySampler().start()
    try:
        with fast_server(harness=harness, python=python, env=env, log=out / "server.log"):
            for k in range(1, args.rounds + 1):
                print(f"round {k} N={args.n}", flush=True)
                for name in (list(runs) if k % 2 else list(runs)[::-1]):
                    run_env = toolops_env if name.startswith("toolops") else env
                    path = out / f"{name}-{k}.json"
                    since = time.time()
                    run_logged([python, *runs[name], "--out", str(path)], cwd=harness, env=run_env,
                               log=out / f"{name}-{k}.log")
                    run = json.loads(path.read_text())
                    busy = sampler.burst(since=since, until=time.time(), wall_s=run["wall_s"])
                    shares[name].append(_report(name, run, busy))
            for name, figures in shares.items():
                summary = ", ".join(f"{part} {100 * statistics.median(f[part] for f in figures):.0f} %"
                                    for part in ("all", "head", "middle", "tail"))
                print(f"{name}: median busy share {summary} ({args.rounds} rounds; results in {out})")
    finally:
        sampler.stop()


if __name__ == "__main__":
    main()
