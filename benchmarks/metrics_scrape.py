"""How /metrics scrape time grows with the ledger (ledger-derived figures are computed per scrape).

Run: DJANGO_SETTINGS_MODULE=config.settings.test python benchmarks/metrics_scrape.py
Creates a throw-away test database, fills it in steps and prints the median scrape time per size
and its ratio to the smallest size (ratios within one run; absolute times depend on the machine).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")

import django

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402

# Each operation gets this many events (created, submitted, a few observations, accepted).
EVENTS_PER_OPERATION = 8
SIZES = (1_000, 5_000, 20_000)
SCRAPES = 5


def main() -> None:
    setup_test_environment()
    name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        from ledger.models import Operation, OperationEvent
        from ledger.states import State
        from tests.ledger.factories import ToolServerFactory
        from toolops.metrics import metrics_render

        server = ToolServerFactory(name="bench")
        made = 0
        base = None
        for size in SIZES:
            ops = [Operation(call_node_id=f"n-{i}", server=server, tool_name="render",
                             descriptor_version="d", request_digest="r", adapter_version="a",
                             submission_key=f"k-{i}", state=State.WORKING) for i in range(made, size)]
            Operation.objects.bulk_create(ops, batch_size=2000)
            events = [OperationEvent(operation=op, seq=s, kind="observed" if s > 1 else "created",
                                     from_state="WORKING", to_state="WORKING", execution_epoch=1,
                                     cancel_generation=0)
                      for op in ops for s in range(1, EVENTS_PER_OPERATION + 1)]
            OperationEvent.objects.bulk_create(events, batch_size=5000)
            made = size
            timings = []
            for _ in range(SCRAPES):
                t = time.perf_counter()
                metrics_render()
                timings.append(time.perf_counter() - t)
            median = statistics.median(timings)
            base = base or median
            print(f"operations={size:>6} events={size * EVENTS_PER_OPERATION:>7} "
                  f"scrape_median_ms={median * 1000:8.1f} ratio_to_first={median / base:5.2f}")
    finally:
        connection.creation.destroy_test_db(name, verbosity=0)


if __name__ == "__main__":
    main()
