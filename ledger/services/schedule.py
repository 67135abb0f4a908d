"""The schedule of an operation row: the one module that builds writes of `next_poll_at` and the
lease (`lease_owner`, `lease_expires_at`).

Every service that claims a row, hands it back, pauses it or ends it takes its schedule fields
from here and merges them into its guarded UPDATE; no other module names these fields in a write
(`tests/test_architecture.py` checks the source for it). One owner keeps one rule in one place:
a row in a polled state always has a next poll time or a lease (the CHECK constraint
`op_open_row_scheduled`), so only the states that wait for something other than a poll (an input
answer, an operator, acceptance) are ever written with `schedule_cleared`.

The builders return plain field dicts and write nothing themselves: the write stays the caller's
compare-and-set UPDATE, with its row count checked, in the caller's transaction. The one write
here is `operations_poll_sooner`, a pushed status's hint, which changes nothing but the schedule.
What time a row should be polled next (interval, jitter, backoff, expiry) is decided above, in
`toolops.scheduling`; this module only spells the write.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Q
from django.db.models.expressions import Combinable
from django.utils import timezone

from ledger.models import Operation
from ledger.states import POLLABLE

__all__ = ["RELEASE", "lease_extended", "operations_poll_sooner", "schedule_at",
           "schedule_cleared", "schedule_leased", "schedule_now"]

# Fields that end a lease; part of every write that hands the row back to the dispatcher.
RELEASE: dict[str, Any] = {"lease_owner": "", "lease_expires_at": None}


def _released(fields: dict[str, Any], *, release: bool) -> dict[str, Any]:
    return {**RELEASE, **fields} if release else fields


def schedule_at(*, at: datetime | Combinable, release: bool = True) -> dict[str, Any]:
    """Poll again at `at` (a time or an SQL expression), by default handing the lease back.

    `release=False` keeps the lease: a writer that goes on working the row in this same cycle
    (a fetch that follows the terminal status) must not let a dispatcher claim it meanwhile.
    """
    return _released({"next_poll_at": at}, release=release)


def schedule_now(*, release: bool = True) -> dict[str, Any]:
    """Due at once: the next step needs a poll and nothing argues for waiting."""
    return schedule_at(at=timezone.now(), release=release)


def schedule_cleared(*, release: bool = True) -> dict[str, Any]:
    """No next poll: the row waits for an input answer, an operator or nothing (it is final).

    Only for states outside the polled ones; the CHECK constraint refuses it for a polled state
    that holds no lease, so a mistake here fails the write instead of stranding the row.
    """
    return _released({"next_poll_at": None}, release=release)


def schedule_leased(*, owner: str, until: datetime) -> dict[str, Any]:
    """Held by `owner` until `until`, and due again exactly then.

    The next poll time moves to the lease's end so that the claim's scan over due rows never
    walks past rows in flight, and a holder that dies is replaced exactly when its lease runs out.
    """
    return {"lease_owner": owner, "lease_expires_at": until, "next_poll_at": until}


def lease_extended(*, until: datetime) -> dict[str, Any]:
    """The holder's lease, moved to `until`; the next poll time is left as the poll wrote it.

    For a worker that keeps a row between two polls of its own: its write must name itself as
    the holder in its WHERE (the lease still ours and not run out), so an expired or taken lease
    is never revived.
    """
    return {"lease_expires_at": until}


def operations_poll_sooner(*, server_id: int, remote_ids: list[str]) -> int:
    """A pushed status (`notifications/tasks/status`) makes its rows due now; nothing else.

    The push is a hint, never a fact: no state or server status is written from it, only the
    schedule, and the poll it triggers still takes a QPS token and goes through the same guards.
    Leased rows are left alone (their poll is in flight), and so is INPUT_REQUIRED (it resumes
    when its input is answered, not when the server talks).
    """
    if not remote_ids:
        return 0
    now = timezone.now()
    return (
        Operation.objects.filter(server_id=server_id, remote_id__in=remote_ids,
                                 state__in=POLLABLE, next_poll_at__gt=now)
        .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now))
        .update(**schedule_at(at=now, release=False))
    )
