"""Cancel confirmation latency against the reference MCP server (a gate figure).

For each of N operations: submit a long `sleep_then_complete` task, then `operation_cancel` it.
The figure is the one acceptance stores in the ledger: `cancel_confirmation_ms` on the `accepted`
event, from the committed CANCEL_REQUESTED to the accepted `cancelled` receipt (lock + bump +
commit, `tasks/cancel` over HTTP, the audit `tasks/result`, acceptance). Figures are read back from
the ledger, so the script measures what a gate would report.

Run:  DATABASE_URL=postgres://... python benchmarks/cancel_latency.py [--n 200]
      (without DATABASE_URL: a fresh SQLite file, the embedded default)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile (no interpolation: every figure is a measured value)."""
    rank = max(1, int(-(-p * len(sorted_values) // 100)))
    return sorted_values[rank - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description="cancel confirmation latency p50/p99")
    parser.add_argument("--n", type=int, default=200)
    # The server's QPS cap: submit and cancel share its token bucket, so at the default cap of 10
    # the figure includes up to two token intervals of pacing; a high cap isolates the protocol.
    parser.add_argument("--max-qps", type=float, default=10.0)
    args = parser.parse_args()

    tmp = tempfile.mkdtemp(prefix="toolops-bench-")
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{tmp}/bench.sqlite3")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    # The reference server listens on loopback, which the server URL policy refuses unless listed.
    os.environ.setdefault("TOOLOPS_SERVER_HOSTS", "public,127.0.0.0/8,::1")
    import django

    django.setup()
    from django.core.management import call_command

    from ledger.models import OperationEvent
    from toolops.reference_server.launch import running_reference_server
    from toolops.services.cancel import operation_cancel
    from toolops.services.servers import server_add
    from toolops.services.submit import operation_submit

    call_command("migrate", verbosity=0)
    run_tag = f"bench-{int(time.time())}"
    with running_reference_server(poll_interval_ms=100) as url:
        server = server_add(name=run_tag, url=url, max_qps=args.max_qps)
        outcomes: dict[str, int] = {}
        op_ids = []
        wall: list[float] = []
        for i in range(args.n):
            op = operation_submit(server_name=server.name, tool_name="sleep_then_complete",
                                  call_node_id=f"{run_tag}-{i}",
                                  arguments={"seconds": 60, "value": "never"}, ttl_ms=120_000)
            started = time.perf_counter()
            outcome = operation_cancel(operation_id=op.id)
            wall.append((time.perf_counter() - started) * 1000)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            op_ids.append(op.id)
    figures = sorted(
        float(d["cancel_confirmation_ms"])
        for d in OperationEvent.objects.filter(operation_id__in=op_ids, kind="accepted")
        .values_list("data", flat=True)
        if "cancel_confirmation_ms" in d
    )
    wall.sort()
    db = django.db.connection.vendor
    print(f"cancels: {args.n}  database: {db}  outcomes: {outcomes}")
    print(f"confirmation latency from the ledger (n={len(figures)}): "
          f"p50 {_percentile(figures, 50):.1f} ms  p99 {_percentile(figures, 99):.1f} ms  "
          f"mean {statistics.fmean(figures):.1f} ms  max {figures[-1]:.1f} ms")
    print(f"operation_cancel call, wall clock:           "
          f"p50 {_percentile(wall, 50):.1f} ms  p99 {_percentile(wall, 99):.1f} ms")


if __name__ == "__main__":
    main()
