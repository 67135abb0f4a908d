"""How many poll messages wait in the broker: the dispatcher claims only what workers can take.

A claim leases rows for TOOLOPS_LEASE_SECONDS. Claimed faster than workers poll, rows would wait
in the broker until their leases ran out, be claimed again and polled twice (the second poll of
a lost lease is refused, but it costs a task and a read). So each tick tops the queue up to
TOOLOPS_DISPATCH_MAX_QUEUED messages, no more; rows not claimed stay due in the ledger.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import redis
from django.conf import settings

logger = logging.getLogger("toolops.broker")

# The dispatcher asks for the queue's length on every pass (several a second). Through kombu
# that is a new broker connection and channel each time, which cost more CPU than the claim
# itself; a plain client kept per process (and per broker URL) asks with one LLEN. Its socket
# timeouts bound the ask: a Redis that hangs costs a pass a bounded wait, then "no limit".
_REDIS_TIMEOUT_SECONDS = 2.0
_CLIENTS: dict[tuple[int, str], Any] = {}


def _redis_client(app: Any) -> Any:
    url = app.conf.broker_url
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        return None
    # Keyed by process id too: a client made before a fork must not be shared with the child.
    key = (os.getpid(), url)
    client = _CLIENTS.get(key)
    if client is None:
        client = _CLIENTS[key] = redis.Redis.from_url(
            url, socket_timeout=_REDIS_TIMEOUT_SECONDS,
            socket_connect_timeout=_REDIS_TIMEOUT_SECONDS)
    return client


def poll_queue_length(*, app: object, queue: str) -> int | None:
    """Messages waiting in `queue` (Redis broker), or None when the broker cannot tell."""
    try:
        client = _redis_client(app)
        if client is not None:
            return int(client.llen(queue))
        with app.connection_for_read() as conn:  # type: ignore[attr-defined]
            return int(conn.default_channel.client.llen(queue))
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
