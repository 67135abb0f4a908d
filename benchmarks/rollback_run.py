"""A rollback run with rows in flight, against the reference MCP server .

1. N long calls are submitted on the tasks path (`sleep_then_complete`, a few seconds each);
   a read-only dual tool (`read_value`) runs with a canary share and shadow on, so both paths and
   shadow rows are in flight too.
2. The tasks executor runs in a thread; while it is polling, `rollout_move(to_path="legacy")`
   lands (the service behind `python manage.py toolops rollback --to legacy`).
3. The old executor's lease holder comes back with its stale claims; the legacy executor then
   continues every moved row with the remote operations that already exist.
Counts are read from the ledger and from the server's own counters (`/_peer/stats`).

Run:  DATABASE_URL=postgres://... python benchmarks/rollback_run.py [--n 40]
      (without DATABASE_URL: a fresh SQLite file)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description="rollback with rows in flight, with counts")
    parser.add_argument("--n", type=int, default=40, help="long task calls in flight")
    parser.add_argument("--reads", type=int, default=20, help="read_value calls (canary 50%%)")
    args = parser.parse_args()

    tmp = tempfile.mkdtemp(prefix="toolops-bench-")
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{tmp}/bench.sqlite3")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    # The reference server listens on loopback, which the server URL policy refuses unless listed.
    os.environ.setdefault("TOOLOPS_SERVER_HOSTS", "public,127.0.0.0/8,::1")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.db.models import Count
    from django.utils import timezone

    from ledger.models import Operation, OperationEvent, OutboxEvent, TerminalReceipt
    from ledger.selectors.rollout import shadow_report
    from ledger.states import OPEN
    from toolops.reference_server.launch import peer_stats, running_reference_server
    from toolops.services.executors import (
        executor_claim_due,
        executor_lease_owner,
        executor_run,
    )
    from toolops.services.observe import operation_poll
    from toolops.services.rollout import rollout_configure, rollout_move
    from toolops.services.servers import server_add
    from toolops.services.submit import operation_submit

    call_command("migrate", verbosity=0)
    tag = f"rb-{int(time.time())}"
    with running_reference_server(poll_interval_ms=200) as url:
        server = server_add(name=tag, url=url, sync_bounds={"read_value": 10.0})
        rollout_configure(server_name=tag, tool_name="read_value", canary_percent=50.0,
                          shadow=True, actor="bench", reason="canary + shadow for the run")
        before = peer_stats(url)
        ops = [
            operation_submit(server_name=tag, tool_name="sleep_then_complete",
                             call_node_id=f"{tag}/task/{i}",
                             arguments={"seconds": 2.0 + (i % 5) * 0.3, "value": f"v{i}"},
                             ttl_ms=120_000)
            for i in range(args.n)
        ]
        reads = [
            operation_submit(server_name=tag, tool_name="read_value",
                             call_node_id=f"{tag}/read/{i}",
                             arguments={"seconds": 1.5, "value": f"r{i}"}, ttl_ms=120_000)
            for i in range(args.reads)
        ]
        node_ids = [o.call_node_id for o in ops + reads]

        # A worker of the tasks path holds a batch of leases and stalls (a slow or paused pod).
        stale_owner = executor_lease_owner(path="tasks")
        Operation.objects.filter(id__in=[o.id for o in ops[:10]]).update(
            next_poll_at=timezone.now())
        stale_claims = executor_claim_due(path="tasks", owner=stale_owner, limit=10)

        # The live tasks executor polls concurrently while the rollback lands.
        tasks_stats: dict[str, object] = {}

        def tasks_executor() -> None:
            try:
                stats = executor_run(path="tasks", until_idle=False, max_seconds=1.5)
                tasks_stats.update(polls=stats.polls, outcomes=stats.outcomes)
            finally:
                connection.close()

        worker = threading.Thread(target=tasks_executor)
        worker.start()
        time.sleep(0.6)
        in_flight = Operation.objects.filter(server=server, state__in=OPEN,
                                             executor_path="tasks").count()
        change = rollout_move(to_path="legacy", reason="bench: canary error budget burned",
                              actor="bench:oncall", server_name=tag)
        worker.join()
        stale = Counter(operation_poll(operation_id=i, lease_owner=stale_owner)
                        for i in stale_claims)
        legacy = executor_run(path="legacy", until_idle=True, max_seconds=120)
        time.sleep(0.3)
        after = peer_stats(url)

        moved = Operation.objects.filter(server=server, execution_epoch=2)
        receipts = Counter(dict(
            TerminalReceipt.objects.filter(call_node_id__in=node_ids)
            .values_list("call_node_id").annotate(n=Count("id")).values_list("call_node_id", "n")
        ))
        keys = [o.submission_key for o in Operation.objects.filter(server=server)]
        created = after["tasks_created"] - before["tasks_created"]
        task_rows = Operation.objects.filter(server=server, execution_mode="task").count()
        figures = {
            "calls": len(node_ids),
            "task_rows_total (incl. shadows)": task_rows,
            "in_flight_on_tasks_path_at_rollback": in_flight,
            "rows_moved_by_rollback": change.rows_moved,
            "moved_rows_at_epoch_2": moved.count(),
            "rollback_change": {"actor": change.actor, "reason": change.reason},
            "tasks_executor_during_rollback": tasks_stats,
            "stale_worker_outcomes": dict(stale),
            "stale_epoch_refused_events": OperationEvent.objects.filter(
                operation__server=server, kind="stale_epoch_refused").count(),
            "legacy_executor": {"polls": legacy.polls, "outcomes": legacy.outcomes},
            "call_nodes_with_exactly_one_receipt": sum(1 for n in node_ids if receipts[n] == 1),
            "call_nodes_with_more_than_one_receipt": sum(1 for n in node_ids if receipts[n] > 1),
            "receipts_at_epoch_2": TerminalReceipt.objects.filter(
                call_node_id__in=node_ids, execution_epoch=2).count(),
            "outbox_rows": OutboxEvent.objects.filter(
                receipt__call_node_id__in=node_ids).count(),
            "open_rows_left": Operation.objects.filter(server=server, state__in=OPEN).count(),
            "server_tasks_created": created,
            "server_submission_keys_seen_twice": sum(
                1 for k in keys if after["submission_keys"].get(k, 0) > 1),
            "second_remote_operations": created - task_rows,
            "shadow_report": shadow_report(server_name=tag)["counts"],
        }
    print(json.dumps(figures, indent=2, sort_keys=False))


if __name__ == "__main__":
    main()
