"""The schedule of an operation row: the one module that builds writes of `next_poll_at` and the
lease (`lease_owner`, `lease_expires_at`).

Every service that claims a row, hands it back, pauses it or ends it takes its schedule fields
from here and merges them into its guarded UPDATE; no other module names these fields in a write
(`tests/test_architecture.py` checks the source for it). One owner keeps one rule in one place:
a row in a polled state always has a next poll time or a lease (the CHECK constraint
`op_open_row_scheduled`), so only the states that wait for something other than a poll (an input
answer, an operator, acceptance) are ever written with `schedule_cleared`.

The builders return plain field dicts and write nothing themselves: the write stays the caller's
compare-and-set UPDATE, with its row count checked, in the caller's transaction. What time a row
should be polled next (interval, jitter, backoff, expiry) is decided above, in
`toolops.scheduling`; this module only spells the write.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models.expressions import Combinable
from django.utils import timezone

__all__ = ["RELEASE", "lease_extended", "schedule_at", "schedule_cleared", "schedule_leased",
           "schedule_now"]

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
