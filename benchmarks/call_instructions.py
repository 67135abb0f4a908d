"""Benchmark (not a test): instructions per call, counted by valgrind, against a real MCP server.

CPU time on a shared 2-core box varies by ±10 % from run to run, more than most single changes to
the hot path are worth. An instruction count does not: it is the same for the same code and
inputs whatever else the machine does. This runs a driver twice under `valgrind --tool=callgrind`:
`--small` calls and `--large` calls, each submitted through `toolops.api.submit_call` and polled
to its receipt by the embedded executor (`run_embedded`), and prints the difference per call.
Start-up (Python, `django.setup()`, the first session with the server) is the same in both runs
and cancels out, so the figure is what one more call costs this process: the submit, the
terminal poll, the result fetch and the acceptance, in instructions (PostgreSQL's and the
server's own work are not in it; `call_cpu.py` reports those as CPU time).

Compare two versions of the code with the same server and database kind, one after the other
(the driver polls every open row it finds, so two runs must not share a database):

    DATABASE_URL=postgres://root@127.0.0.1:5432/toolops_cpu TOOLOPS_SERVER_HOSTS=public,127.0.0.0/8 \
        .venv/bin/python benchmarks/call_instructions.py --url http://127.0.0.1:8765/mcp

Each run takes one to two minutes (valgrind runs Python about fifty times slower).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _drive(*, url: str, tool: str, calls: int) -> None:
    """The measured process: a few warm-up calls, then `calls` calls to their receipts."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from ledger.models import ToolServer
    from toolops import api
    from toolops.runner import run_embedded

    server = ToolServer.objects.get(url=url)
    tag = f"ir-{uuid.uuid4().hex[:8]}"

    def run(prefix: str, count: int) -> None:
        for i in range(count):
            api.submit_call(server=server.name, tool=tool, call_node_id=f"{tag}-{prefix}{i}",
                            arguments={"i": i}, idempotency_key=f"{tag}-{prefix}{i}")
        time.sleep(1.2)  # every task is past its run time: the polls are terminal polls
        run_embedded(until_idle=True, max_seconds=600)

    run("warm-", 3)  # imports, the session with the server, the adapter: in both runs alike
    run("", calls)


def _counted(*, url: str, tool: str, calls: int) -> int:
    """Instructions the whole driver process executed for `calls` calls."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [valgrind, "--tool=callgrind", f"--callgrind-out-file={tmp}/out", sys.executable,
             __file__, "--drive", str(calls), "--url", url, "--tool", tool],
            capture_output=True, text=True, check=False)
    found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"the driver failed under valgrind:\n{done.stderr[-3000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8765/mcp")
    parser.add_argument("--tool", default="work")
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--large", type=int, default=60)
    parser.add_argument("--drive", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive is not None:
        _drive(url=args.url, tool=args.tool, calls=args.drive)
        return
    if args.large <= args.small:
        raise SystemExit("--large must be above --small")

    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from ledger.models import Operation, ToolServer
    from ledger.states import OPEN
    from toolops.services.servers import server_add

    if Operation.objects.filter(state__in=OPEN).exists():
        # The embedded executor polls every open row it finds: another run's would be counted.
        raise SystemExit("the database has open operations: point DATABASE_URL at a scratch database")
    if not ToolServer.objects.filter(url=args.url).exists():
        server_add(name=f"ir-{uuid.uuid4().hex[:8]}", url=args.url, max_qps=100000)
    small = _counted(url=args.url, tool=args.tool, calls=args.small)
    large = _counted(url=args.url, tool=args.tool, calls=args.large)
    per_call = (large - small) / (args.large - args.small)
    print(f"instructions per call (submit, terminal poll, result, acceptance): {per_call / 1e6:.2f} M")
    print(f"  whole process: {small / 1e6:.0f} M for {args.small} calls, "
          f"{large / 1e6:.0f} M for {args.large} calls")


if __name__ == "__main__":
    main()
