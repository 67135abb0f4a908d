"""The embedded executor: the same services the Celery tasks call, in one process, no broker.

Each row is polled inside the per-row error boundary (toolops.services.boundary): a row whose
cycle crashes is recorded, rescheduled or queued, and the loop goes on with the next row. A
failing tick (the database is away) makes the loop nap, never end; `max_seconds` is checked
before every row, so the loop returns within it plus one row's cycle.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from toolops.services.boundary import MAX_IDLE_SLEEP_SECONDS, executor_loop
from toolops.services.dispatch import (
    ledger_statistics_refresh,
    operations_claim_due,
    operations_next_due_at,
)
from toolops.services.inputs import input_rounds_expire_due

__all__ = ["MAX_IDLE_SLEEP_SECONDS", "RunStats", "run_embedded"]


@dataclass
class RunStats:
    polls: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    tick_errors: int = 0


def _tick() -> None:
    # Unanswered input deadlines get their recorded outcome on every tick; on PostgreSQL, plans
    # cached while the ledger was nearly empty are made again once it has grown (as the fleet's
    # dispatcher tick does).
    input_rounds_expire_due()
    ledger_statistics_refresh()


def run_embedded(*, until_idle: bool, max_seconds: float | None) -> RunStats:
    """Poll due rows until nothing is scheduled (with `until_idle`) or the time is up."""
    owner = f"embedded-{uuid.uuid4().hex[:12]}"
    loop = executor_loop(
        owner=owner, claim=lambda: operations_claim_due(owner=owner),
        next_due=operations_next_due_at, until_idle=until_idle, max_seconds=max_seconds,
        tick=_tick,
    )
    return RunStats(polls=loop.polls, outcomes=loop.outcomes, tick_errors=loop.tick_errors)
