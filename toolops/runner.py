"""The embedded executor: the same services the Celery tasks call, in one process, no broker."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from django.utils import timezone

from toolops.services.dispatch import operations_claim_due, operations_next_due_at
from toolops.services.inputs import input_rounds_expire_due
from toolops.services.observe import operation_poll

# Longest nap between ticks: bounds how late a poll can be noticed when the schedule is empty.
MAX_IDLE_SLEEP_SECONDS = 0.5


@dataclass
class RunStats:
    polls: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)


def run_embedded(*, until_idle: bool, max_seconds: float | None) -> RunStats:
    """Poll due rows until nothing is scheduled (with `until_idle`) or the time is up."""
    owner = f"embedded-{uuid.uuid4().hex[:12]}"
    stats = RunStats()
    started = time.monotonic()
    while True:
        if max_seconds is not None and time.monotonic() - started >= max_seconds:
            return stats
        input_rounds_expire_due()  # unanswered input deadlines get their recorded outcome
        for op_id in operations_claim_due(owner=owner):
            outcome = operation_poll(operation_id=op_id, lease_owner=owner).split(":")[0]
            stats.polls += 1
            stats.outcomes[outcome] = stats.outcomes.get(outcome, 0) + 1
        next_due = operations_next_due_at()
        if next_due is None:
            if until_idle:
                return stats
            time.sleep(MAX_IDLE_SLEEP_SECONDS)
            continue
        wait = (next_due - timezone.now()).total_seconds()
        if wait > 0:
            time.sleep(min(wait, MAX_IDLE_SLEEP_SECONDS))
