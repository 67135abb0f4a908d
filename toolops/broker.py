"""How many poll messages wait in the broker: the dispatcher claims only what workers can take.

A claim leases rows for TOOLOPS_LEASE_SECONDS. Claimed faster than workers poll, rows would wait
in the broker until their leases ran out, be claimed again and polled twice (the second poll of
a lost lease is refused, but it costs a task and a read). So each tick tops the queue up to
TOOLOPS_DISPATCH_MAX_QUEUED messages, no more; rows not claimed stay due in the ledger.
"""

from __future__ import annotations

import logging

from django.conf import settings

logger = logging.getLogger("toolops.broker")


def poll_queue_length(*, app: object, queue: str) -> int | None:
    """Messages waiting in `queue` (Redis broker), or None when the broker cannot tell."""
    try:
        with app.connection_for_read() as conn:  # type: ignore[attr-defined]
            client = conn.default_channel.client
            return int(client.llen(queue))
    except Exception as exc:  # any other broker, or Redis unreachable: no limit from here
        logger.debug("queue length unavailable: %s", exc)
        return None


def dispatch_room(*, app: object, queue: str = "celery", rows_per_message: int = 1) -> int | None:
    """How many rows this tick may claim (None: the claim batch alone limits it).

    TOOLOPS_DISPATCH_MAX_QUEUED counts rows: a waiting batch message counts as a full batch."""
    waiting = poll_queue_length(app=app, queue=queue)
    if waiting is None:
        return None
    return max(int(settings.TOOLOPS_DISPATCH_MAX_QUEUED) - waiting * max(rows_per_message, 1), 0)
