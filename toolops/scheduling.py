"""When to poll next: the server's interval, never under a floor, plus jitter, inside the budget.

Two delays:
- steady: the server's suggested interval (`pollInterval`), or the default when it sends none,
  never under the floor, plus jitter added on top (never subtracted), so the server's own pace is
  never exceeded and a fleet does not poll in lock step;
- after an error (429, 503, transport trouble): the steady lower bound, raised to the server's
  `Retry-After` when it sent one, plus full jitter over an exponential window
  (`base * 2**(errors-1)`, capped). The Retry-After is a floor, never shortened by jitter.

Either is cut at the operation's deadline (`expires_at`: the earlier of the server's ttl and our
wait budget), so the row gets one last look at its deadline, where it is classified.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from django.conf import settings

_rng = random.SystemRandom()
# See poll_deadline_reason: how far apart two timestamps taken in one submit can be.
BUDGET_MATCH_SLACK_SECONDS = 1.0


def _steady_floor(*, poll_interval_ms: int | None) -> float:
    floor = float(settings.TOOLOPS_POLL_FLOOR_SECONDS)
    base = (
        poll_interval_ms / 1000.0
        if poll_interval_ms is not None
        else float(settings.TOOLOPS_POLL_DEFAULT_SECONDS)
    )
    return max(base, floor)


def poll_delay_seconds(*, poll_interval_ms: int | None, retry_after_s: float | None = None) -> float:
    """The steady delay before the next poll (a Retry-After, when given, is a floor)."""
    base = _steady_floor(poll_interval_ms=poll_interval_ms)
    if retry_after_s is not None:
        base = max(base, retry_after_s)
    return base + _rng.uniform(0.0, poll_jitter_window_seconds(base_s=base))


def poll_jitter_window_seconds(*, base_s: float) -> float:
    """Width of the jitter added to a steady delay of `base_s`.

    Jitter spreads a herd (rows submitted or released together) over time. Its share of the
    interval is TOOLOPS_POLL_JITTER for intervals of TOOLOPS_POLL_JITTER_FULL_SECONDS and longer,
    and shrinks in proportion below that: at 500 ms it is a quarter of the share (25 ms, not
    100 ms). A short interval already spreads a herd over few, dense rounds; the extra 75 ms
    would only be added to every short call's latency (its last poll comes that much later),
    while 25 ms still puts several server round trips between the first and last of a herd, and
    the per-server QPS cap, not the jitter, is what keeps a server from being overrun.
    """
    full = float(settings.TOOLOPS_POLL_JITTER_FULL_SECONDS)
    share = float(settings.TOOLOPS_POLL_JITTER)
    if full > 0 and base_s < full:
        share *= base_s / full
    return base_s * share


def backoff_window_seconds(*, consecutive_errors: int) -> float:
    """The width of the full-jitter window after `consecutive_errors` failed calls in a row."""
    n = max(consecutive_errors, 1)
    base = float(settings.TOOLOPS_BACKOFF_BASE_SECONDS)
    cap = float(settings.TOOLOPS_BACKOFF_CAP_SECONDS)
    # The exponent is clamped before the power so a long outage cannot overflow the float.
    return min(cap, base * 2.0 ** min(n - 1, 30))


def backoff_delay_seconds(
    *, poll_interval_ms: int | None, consecutive_errors: int, retry_after_s: float | None
) -> float:
    """The delay after a failed call: max(steady floor, Retry-After) + U(0, backoff window)."""
    lower = _steady_floor(poll_interval_ms=poll_interval_ms)
    if retry_after_s is not None:
        lower = max(lower, retry_after_s)
    return lower + _rng.uniform(0.0, backoff_window_seconds(consecutive_errors=consecutive_errors))


def _clamp(*, now: datetime, at: datetime, expires_at: datetime | None) -> datetime:
    if expires_at is not None and at > expires_at:
        return max(expires_at, now)
    return at


def next_poll_at(
    *, now: datetime, poll_interval_ms: int | None, expires_at: datetime | None,
    retry_after_s: float | None = None,
) -> datetime:
    """The next steady poll time, never after the expiry."""
    at = now + timedelta(seconds=poll_delay_seconds(
        poll_interval_ms=poll_interval_ms, retry_after_s=retry_after_s
    ))
    return _clamp(now=now, at=at, expires_at=expires_at)


def next_poll_after_error_at(
    *, now: datetime, poll_interval_ms: int | None, expires_at: datetime | None,
    consecutive_errors: int, retry_after_s: float | None,
) -> datetime:
    """The next poll after a failed call (backoff with full jitter), never after the expiry."""
    at = now + timedelta(seconds=backoff_delay_seconds(
        poll_interval_ms=poll_interval_ms, consecutive_errors=consecutive_errors,
        retry_after_s=retry_after_s,
    ))
    return _clamp(now=now, at=at, expires_at=expires_at)


def wait_budget_ends_at(*, created_at: datetime) -> datetime:
    return created_at + timedelta(seconds=float(settings.TOOLOPS_WAIT_BUDGET_SECONDS))


def poll_deadline_reason(
    *, now: datetime, created_at: datetime, expires_at: datetime | None
) -> str | None:
    """Why polling must stop now, or None.

    The deadline is `expires_at` (set at creation to the end of our wait budget, and lowered to the
    server's ttl when that ends first), so whoever resolves a row by hand can extend it there.
    Only a row without one falls back to the budget counted from its creation. The reason says
    which limit it was: our budget, or the server's expiry.
    """
    budget_end = wait_budget_ends_at(created_at=created_at)
    deadline = expires_at if expires_at is not None else budget_end
    if now < deadline:
        return None
    # created_at is stamped a moment after the budget deadline was computed at submit: a deadline
    # within this slack of the budget's end is the budget.
    slack = timedelta(seconds=BUDGET_MATCH_SLACK_SECONDS)
    return "wait_budget_exhausted" if deadline >= budget_end - slack else "expired"
