"""Benchmark (not a test): CPU per call, by phase, in this process, against a real MCP server.

Submits `--calls` calls through the public API (`toolops.api.submit_call`, the same entry point
the perf harness's submitters use), then polls them to their receipts with the embedded executor
(`run_embedded`, one thread). Prints, per phase, the process CPU per call, the wall time and the
PostgreSQL statements per call, and the CPU every local `postgres` process spent meanwhile
(read from /proc: the server's share of the call, backends, WAL writer and checkpointer; only
meaningful on a quiet machine with PostgreSQL on it); with `--profile`, the top functions of each
phase by cumulative time (cProfile), which is where a change to the submit or poll path is measured first.

The server is any MCP 2025-11-25 task server; the perf harness's fast server is the usual one
(`FAST_TASK_SECONDS=1 FAST_POLL_MS=500 python ../shared/perf/fastserver.py --port 8765`):

    DATABASE_URL=postgres://root@127.0.0.1:5432/toolops_cpu TOOLOPS_SERVER_HOSTS=public,127.0.0.0/8 \
        .venv/bin/python manage.py migrate -v0
    DATABASE_URL=... TOOLOPS_SERVER_HOSTS=... .venv/bin/python benchmarks/call_cpu.py \
        --url http://127.0.0.1:8765/mcp --calls 500 [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django

django.setup()

from django.db import connection  # noqa: E402

from ledger.models import Operation, OperationEvent, TerminalReceipt, ToolServer  # noqa: E402
from ledger.states import OPEN  # noqa: E402
from toolops import api  # noqa: E402
from toolops.runner import run_embedded  # noqa: E402
from toolops.services.servers import server_add  # noqa: E402

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _postgres_cpu_s() -> float:
    """CPU seconds (user + system) of every process named `postgres` on this machine."""
    total = 0
    for entry in Path("/proc").iterdir() if Path("/proc/self/stat").exists() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone between the listing and the read
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        if comm != "postgres" and not comm.startswith("postgres"):
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / _TICKS


def _package(filename: str) -> str:
    """The package a profiled function's file belongs to: where a phase's CPU goes, by library."""
    path = Path(filename)
    parts = path.parts
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1].removesuffix(".py")
    root = Path(__file__).resolve().parents[1]
    if path.is_absolute() and path.is_relative_to(root):
        return "project:" + path.relative_to(root).parts[0].removesuffix(".py")
    if filename.startswith("<") or filename == "~":
        return "(builtins)"
    return "stdlib:" + path.name.removesuffix(".py")


def _by_package(stats: pstats.Stats, calls: int, *, top: int = 18) -> str:
    """Own time (tottime) per package, per call: a diffuse profile still shows which library it is."""
    totals: dict[str, float] = {}
    for (filename, _line, _name), row in stats.stats.items():  # type: ignore[attr-defined]
        package = _package(filename)
        totals[package] = totals.get(package, 0.0) + row[2]
    whole = sum(totals.values()) or 1.0
    lines = [f"own CPU by package (ms/call, share), {calls} calls:"]
    for package, seconds in sorted(totals.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {package:<32} {seconds / calls * 1000:6.3f}  {seconds / whole:6.1%}")
    return "\n".join(lines)


def _phase(name: str, calls: int, fn: Callable[[], object], *, profile: bool, top: int,
           dump: str | None = None) -> None:
    """Run `fn` and print its figures per unit: per call, or per poll when `fn` returns a count."""
    # CPU time, not wall: a wait on PostgreSQL or the server is not this process's cost.
    prof = cProfile.Profile(time.process_time) if profile else None
    statements = [0]

    def count(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        statements[0] += 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        cpu0, wall0, pg0 = time.process_time(), time.perf_counter(), _postgres_cpu_s()
        if prof is not None:
            prof.enable()
        units = fn()
        if prof is not None:
            prof.disable()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        pg = _postgres_cpu_s() - pg0
    if isinstance(units, int) and units > 0:
        calls = units
    print(f"{name:>7}: {cpu / calls * 1000:6.2f} ms CPU/call, {pg / calls * 1000:6.2f} ms postgres CPU/call, "
          f"{wall / calls * 1000:6.2f} ms wall/call, "
          f"{statements[0] / calls:5.1f} statements/call ({calls} {'polls' if units else 'calls'})")
    if prof is not None:
        out = io.StringIO()
        stats = pstats.Stats(prof, stream=out)
        stats.sort_stats("cumulative").print_stats(top)
        stats.sort_stats("tottime").print_stats(top // 2)
        print(out.getvalue())
        print(_by_package(stats, calls))
        if dump:
            # For `pstats` by hand: callers (print_callers), other sort orders.
            os.makedirs(dump, exist_ok=True)
            prof.dump_stats(os.path.join(dump, f"{name}.pstats"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8765/mcp")
    parser.add_argument("--tool", default="work")
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--dump", metavar="DIR",
                        help="with --profile, also write each phase's cProfile stats to DIR/<phase>.pstats")
    parser.add_argument("--top", type=int, default=45)
    args = parser.parse_args()

    if Operation.objects.filter(state__in=OPEN).exists():
        # The embedded executor polls every open row it finds: another run's would be counted.
        raise SystemExit("the database has open operations: point DATABASE_URL at a scratch database")
    name = f"cpu-{uuid.uuid4().hex[:8]}"
    if not ToolServer.objects.filter(url=args.url).exists():
        server_add(name=name, url=args.url, max_qps=100000)
    server = ToolServer.objects.get(url=args.url)
    # Warm the process (imports, the session with the server, the adapter) outside the figures.
    for i in range(5):
        api.submit_call(server=server.name, tool=args.tool, call_node_id=f"{name}-warm-{i}",
                        arguments={}, idempotency_key=f"{name}-warm-{i}")
    run_embedded(until_idle=True, max_seconds=60)

    def submit() -> None:
        for i in range(args.calls):
            api.submit_call(server=server.name, tool=args.tool, call_node_id=f"{name}-{i}",
                            arguments={"i": i}, idempotency_key=f"{name}-{i}")

    _phase("submit", args.calls, submit, profile=args.profile, top=args.top, dump=args.dump)
    time.sleep(1.2)  # every task is past its run time: the poll phase is terminal polls
    _phase("poll", args.calls, lambda: run_embedded(until_idle=True, max_seconds=600) and None,
           profile=args.profile, top=args.top, dump=args.dump)
    # Working polls: calls whose tasks run for minutes, each polled about once.
    working = min(args.calls, 200)
    for i in range(working):
        api.submit_call(server=server.name, tool=args.tool, call_node_id=f"{name}-long-{i}",
                        arguments={"seconds": 600}, idempotency_key=f"{name}-long-{i}")
    time.sleep(0.7)
    _phase("working", working, lambda: run_embedded(until_idle=False, max_seconds=3.0).polls,
           profile=args.profile, top=args.top, dump=args.dump)
    done = TerminalReceipt.objects.filter(call_node_id__startswith=f"{name}-").exclude(
        call_node_id__contains="-warm-").count()
    open_rows = Operation.objects.filter(call_node_id__startswith=f"{name}-", receipt__isnull=True).exclude(
        call_node_id__contains="-long-").count()
    print(f"receipts: {done}/{args.calls}; rows without a receipt: {open_rows}")
    # The long-running rows would be polled by the next run: out of the way (no receipt holds them).
    long_rows = Operation.objects.filter(call_node_id__startswith=f"{name}-long-")
    OperationEvent.objects.filter(operation__in=long_rows).delete()
    long_rows.delete()


if __name__ == "__main__":
    main()
