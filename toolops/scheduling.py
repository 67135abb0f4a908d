"""When to poll next: the server's interval, never under a floor, plus jitter, inside the expiry."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from django.conf import settings

_rng = random.SystemRandom()


def poll_delay_seconds(*, poll_interval_ms: int | None, retry_after_s: float | None = None) -> float:
    """The delay before the next poll.

    The server's suggestion is the steady rate; a Retry-After overrides it when longer. Jitter is
    added on top (never subtracted) so the server's pace is never exceeded.
    """
    floor = float(settings.TOOLOPS_POLL_FLOOR_SECONDS)
    base = (
        poll_interval_ms / 1000.0
        if poll_interval_ms is not None
        else float(settings.TOOLOPS_POLL_DEFAULT_SECONDS)
    )
    if retry_after_s is not None:
        base = max(base, retry_after_s)
    base = max(base, floor)
    return base + _rng.uniform(0.0, base * float(settings.TOOLOPS_POLL_JITTER))


def next_poll_at(
    *, now: datetime, poll_interval_ms: int | None, expires_at: datetime | None,
    retry_after_s: float | None = None,
) -> datetime:
    """The next poll time, never after the expiry (one last look at expiry classifies the row)."""
    at = now + timedelta(seconds=poll_delay_seconds(
        poll_interval_ms=poll_interval_ms, retry_after_s=retry_after_s
    ))
    if expires_at is not None and at > expires_at:
        return max(expires_at, now)
    return at
