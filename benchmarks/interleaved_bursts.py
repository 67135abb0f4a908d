"""Bursts of naive Celery and of this project, alternating, for ratios that outlast the machine's drift.

On a shared 2-core machine the CPU speed drifts from one minute to the next by more than the
difference between the two systems, so the ratio of one `bench.sh` run depends on the minute each
system ran in. This runs the perf harness's own baselines (`baseline_celery.py`,
`baseline_toolops.py`, unchanged) in rounds, flipping their order every round so a slow minute
falls on both sides, against one fast MCP server it starts and stops. Each round prints the
calls/s ratio and the box CPU per call ratio; `norm` divides each system's box CPU per call by the
server's CPU per call in the same run (the server does the same work per call for both, so it
tracks the machine's speed in that minute).

    PERF_ENV=/tmp/perf-env TOOLOPS_SERVER_HOSTS=public,127.0.0.0/8 \\
        python benchmarks/interleaved_bursts.py --n 2000 --rounds 4

`--toolops-pools prefork,threads` runs this project's fleet once per worker pool in each round
(the order of all runs rotating from round to round), each against the same round's Celery run.

Needs the harness set up (`../shared/perf/setup.sh`) and nothing else on port 8765.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The harness's fast server: 1 s tasks, pollInterval 500 ms (its README's workload).
SERVER_ENV = {"FAST_TASK_SECONDS": "1", "FAST_POLL_MS": "500"}
SERVER_PORT = 8765


def run_logged(cmd: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> None:
    with log.open("w") as out:
        subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, check=True)


def server_wait(url: str, timeout_s: float = 20.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=1.0):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the fast server did not answer at {url}")


@contextlib.contextmanager
def fast_server(*, harness: Path, python: str, env: dict[str, str], log: Path) -> Iterator[None]:
    """The harness's fast server on SERVER_PORT, answering for the block, stopped after it."""
    with log.open("w") as out:
        server = subprocess.Popen([python, "fastserver.py", "--port", str(SERVER_PORT)], cwd=harness,
                                  env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            server_wait(f"http://127.0.0.1:{SERVER_PORT}/stats")
            yield
        finally:
            server.terminate()
            server.wait(timeout=10)


def baseline_runs(*, n: int, pools: list[str], submitters: int) -> dict[str, list[str]]:
    """The harness's command lines for one burst of `n`: naive Celery on prefork first, then
    this project's fleet once per worker pool (named `toolops-<pool>`)."""
    common = ["--n", str(n), "--rate", "0", "--concurrency", "4"]
    runs = {"celery": ["baseline_celery.py", *common, "--pool", "prefork"]}
    for pool in pools:
        runs[f"toolops-{pool}"] = ["baseline_toolops.py", *common, "--pool", pool, "--project", str(ROOT),
                                   "--submitters", str(submitters)]
    return runs


def harness_arguments(ap: argparse.ArgumentParser, *, rounds: int) -> None:
    """The options every script that drives the harness's bursts takes."""
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--harness", default=str(ROOT.parent / "shared" / "perf"))
    ap.add_argument("--perf-env", default=os.environ.get("PERF_ENV", "/tmp/perf-env"))
    ap.add_argument("--submitters", type=int, default=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness_arguments(ap, rounds=4)
    ap.add_argument("--toolops-pools", default="prefork",
                    help="comma-separated worker pools for this project's fleet (Celery's stays prefork)")
    args = ap.parse_args()
    pools = [p.strip() for p in args.toolops_pools.split(",") if p.strip()]

    harness = Path(args.harness)
    python = str(Path(args.perf_env) / "venv" / "bin" / "python")
    env = {**os.environ, **SERVER_ENV, "PERF_ENV": args.perf_env}
    out = Path(tempfile.mkdtemp(prefix="interleaved-"))
    runs = baseline_runs(n=args.n, pools=pools, submitters=args.submitters)
    names = list(runs)
    ratios: dict[str, list[float]] = {name: [] for name in names[1:]}
    norms: dict[str, list[float]] = {name: [] for name in names[1:]}
    with fast_server(harness=harness, python=python, env=env, log=out / "server.log"):
        for k in range(1, args.rounds + 1):
            # Rotate, and flip every other round, so a slow minute falls on every side in turn.
            shift = (k - 1) % len(names)
            order = names[shift:] + names[:shift]
            order = order if k % 2 else order[::-1]
            for name in order:
                # The baselines read PERF_ENV too (their logs, the submitters' files).
                run_logged([python, *runs[name], "--out", str(out / f"{name}-{k}.json")], cwd=harness,
                           env=env, log=out / f"{name}-{k}.log")
            c = json.loads((out / f"celery-{k}.json").read_text())
            for name in names[1:]:
                t = json.loads((out / f"{name}-{k}.json").read_text())
                box_t, box_c = t["box_cpu_ms_per_call"], c["box_cpu_ms_per_call"]
                ratio = t["calls_per_s"] / c["calls_per_s"]
                norm = (box_t / t["server_cpu_ms_per_call"]) / (box_c / c["server_cpu_ms_per_call"])
                ratios[name].append(ratio)
                norms[name].append(norm)
                print(f"round {k} N={args.n} {name}: calls/s {t['calls_per_s']} celery {c['calls_per_s']} "
                      f"ratio x{ratio:.3f}; box CPU/call {box_t} / {box_c} x{box_t / box_c:.3f}; "
                      f"server CPU/call {t['server_cpu_ms_per_call']} / {c['server_cpu_ms_per_call']}; "
                      f"norm x{norm:.3f}; "
                      f"worker RSS {t['worker']['peak_rss_mb']} MB ({t['worker']['processes']}) / "
                      f"{c['worker']['peak_rss_mb']} ({c['worker']['processes']})", flush=True)
        for name in names[1:]:
            print(f"{name}: median calls/s ratio x{statistics.median(ratios[name]):.3f}, "
                  f"median norm x{statistics.median(norms[name]):.3f} "
                  f"({args.rounds} rounds; results in {out})")


if __name__ == "__main__":
    main()
