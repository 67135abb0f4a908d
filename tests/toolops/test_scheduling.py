"""Poll discipline: steady interval with jitter, backoff on 429/503 (with and without Retry-After,
seconds and HTTP-date), the wait budget and the expiry. Faults are injected over real HTTP in
front of the reference SDK peer (tests/peers/fault_transport.py)."""

from __future__ import annotations

import email.utils
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from ledger.models import Operation, OperationEvent, ToolServer
from ledger.states import State
from tests.peers.fault_transport import Fault, FaultTransport
from tests.toolops.helpers import submit_sleep
from toolops.runner import run_embedded
from toolops.scheduling import (
    backoff_delay_seconds,
    backoff_window_seconds,
    next_poll_after_error_at,
    next_poll_at,
    poll_deadline_reason,
    poll_delay_seconds,
    poll_jitter_window_seconds,
)
from toolops.services.dispatch import operations_claim_due
from toolops.services.observe import operation_poll

SAMPLES = 2000


# -- pure scheduling -----------------------------------------------------------------------------

def test_steady_delay_is_the_server_interval_plus_bounded_jitter(settings) -> None:
    settings.TOOLOPS_POLL_JITTER = 0.2
    delays = [poll_delay_seconds(poll_interval_ms=2000) for _ in range(SAMPLES)]
    assert min(delays) >= 2.0 and max(delays) <= 2.4
    # jitter really spreads the fleet (not a constant offset)
    assert max(delays) - min(delays) > 0.3


def test_short_intervals_get_a_proportionally_smaller_jitter_share(settings) -> None:
    settings.TOOLOPS_POLL_JITTER = 0.2
    settings.TOOLOPS_POLL_JITTER_FULL_SECONDS = 2.0
    # Full share from the threshold on; below it the share shrinks with the interval.
    assert poll_jitter_window_seconds(base_s=4.0) == pytest.approx(0.8)
    assert poll_jitter_window_seconds(base_s=2.0) == pytest.approx(0.4)
    assert poll_jitter_window_seconds(base_s=1.0) == pytest.approx(0.1)
    assert poll_jitter_window_seconds(base_s=0.5) == pytest.approx(0.025)
    delays = [poll_delay_seconds(poll_interval_ms=500) for _ in range(SAMPLES)]
    assert min(delays) >= 0.5 and max(delays) <= 0.525
    assert max(delays) - min(delays) > 0.015  # still spread, not a constant offset
    settings.TOOLOPS_POLL_JITTER_FULL_SECONDS = 0.0  # off: the plain share at every interval
    assert poll_jitter_window_seconds(base_s=0.5) == pytest.approx(0.1)


def test_floor_holds_when_the_server_asks_for_zero(settings) -> None:
    settings.TOOLOPS_POLL_FLOOR_SECONDS = 0.5
    assert min(poll_delay_seconds(poll_interval_ms=0) for _ in range(SAMPLES)) >= 0.5


def test_default_interval_when_the_server_sends_none(settings) -> None:
    settings.TOOLOPS_POLL_DEFAULT_SECONDS = 3.0
    assert min(poll_delay_seconds(poll_interval_ms=None) for _ in range(SAMPLES)) >= 3.0


def test_backoff_window_doubles_and_is_capped(settings) -> None:
    settings.TOOLOPS_BACKOFF_BASE_SECONDS = 0.5
    settings.TOOLOPS_BACKOFF_CAP_SECONDS = 3.0
    assert [backoff_window_seconds(consecutive_errors=n) for n in (1, 2, 3, 4, 5, 400)] == [
        0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_backoff_full_jitter_stays_within_bounds_and_honours_retry_after(settings) -> None:
    settings.TOOLOPS_BACKOFF_BASE_SECONDS = 1.0
    settings.TOOLOPS_BACKOFF_CAP_SECONDS = 8.0
    settings.TOOLOPS_POLL_FLOOR_SECONDS = 0.05
    plain = [backoff_delay_seconds(poll_interval_ms=100, consecutive_errors=3, retry_after_s=None)
             for _ in range(SAMPLES)]
    assert min(plain) >= 0.1 and max(plain) <= 0.1 + 4.0
    # full jitter: the whole window is used, not just its top
    assert min(plain) < 0.1 + 1.0 and max(plain) > 0.1 + 3.0
    honoured = [backoff_delay_seconds(poll_interval_ms=100, consecutive_errors=1, retry_after_s=7.0)
                for _ in range(SAMPLES)]
    assert min(honoured) >= 7.0 and max(honoured) <= 8.0


def test_next_poll_never_goes_past_the_expiry() -> None:
    now = timezone.now()
    expires = now + timedelta(seconds=1)
    assert next_poll_at(now=now, poll_interval_ms=60_000, expires_at=expires) == expires
    assert next_poll_after_error_at(now=now, poll_interval_ms=100, expires_at=expires,
                                    consecutive_errors=1, retry_after_s=3600.0) == expires
    past = now - timedelta(seconds=5)
    assert next_poll_at(now=now, poll_interval_ms=100, expires_at=past) == now


def test_deadline_reason_tells_budget_from_expiry(settings) -> None:
    settings.TOOLOPS_WAIT_BUDGET_SECONDS = 60.0
    now = timezone.now()
    assert poll_deadline_reason(now=now, created_at=now, expires_at=None) is None
    assert poll_deadline_reason(now=now, created_at=now - timedelta(seconds=61),
                                expires_at=None) == "wait_budget_exhausted"
    assert poll_deadline_reason(now=now, created_at=now,
                                expires_at=now - timedelta(seconds=1)) == "expired"
    created = now - timedelta(seconds=61)
    assert poll_deadline_reason(now=now, created_at=created,
                                expires_at=created + timedelta(seconds=60)) == "wait_budget_exhausted"
    # a deadline extended by hand (a resolver) is honoured past the original budget
    assert poll_deadline_reason(now=now, created_at=created,
                                expires_at=now + timedelta(seconds=30)) is None


# -- over real HTTP --------------------------------------------------------------------------------



@pytest.fixture
def server_options() -> dict[str, Any]:
    # A generous cap: these tests are about the server's answers, not our own pacing.
    return {"max_qps": 1000.0}


@pytest.fixture
def server(faults: FaultTransport, server: ToolServer) -> ToolServer:
    """The shared row, negotiated through the fault transport (installed first)."""
    return server


def _poll_now(op: Operation) -> tuple[str, datetime]:
    """Make the row due, claim it and poll it once; returns the outcome and the time before."""
    Operation.objects.filter(id=op.id).update(next_poll_at=timezone.now())
    claimed = operations_claim_due(owner="test-poller")
    assert claimed == [op.id]
    before = timezone.now()
    return operation_poll(operation_id=op.id, lease_owner="test-poller"), before


def _last_event(op: Operation) -> OperationEvent:
    return OperationEvent.objects.filter(operation=op).order_by("-seq").first()  # type: ignore[return-value]


@pytest.mark.django_db
@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_in_seconds_is_honoured(server: ToolServer, faults: FaultTransport,
                                            status: int) -> None:
    op = submit_sleep(server, seconds=30, expect=State.WORKING)
    faults.inject(Fault("tasks/get", status, {"Retry-After": "7"}))
    outcome, before = _poll_now(op)
    assert outcome == "poll_error"
    op.refresh_from_db()
    assert op.state == State.WORKING and op.lease_owner == "" and op.next_poll_at is not None
    delay = (op.next_poll_at - before).total_seconds()
    # Retry-After is a floor; the first error's full-jitter window (1 s) sits on top of it.
    assert 7.0 <= delay <= 7.0 + 1.0 + 1.0
    event = _last_event(op)
    assert event.kind == "poll_error"
    assert event.data["retry_after"] == 7.0 and event.data["detail"]["http_status"] == status


@pytest.mark.django_db
@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_as_http_date_is_honoured(server: ToolServer, faults: FaultTransport,
                                              status: int) -> None:
    op = submit_sleep(server, seconds=30, expect=State.WORKING)
    when = timezone.now() + timedelta(seconds=40)
    # timezone.now() is in UTC, which HTTP-date requires
    faults.inject(Fault("tasks/get", status,
                        {"Retry-After": email.utils.format_datetime(when, usegmt=True)}))
    outcome, before = _poll_now(op)
    assert outcome == "poll_error"
    op.refresh_from_db()
    # The HTTP date has one-second resolution.
    assert op.next_poll_at is not None and op.next_poll_at >= when - timedelta(seconds=1.5)
    assert (op.next_poll_at - before).total_seconds() <= 40 + 1.0 + 1.0
    assert 38.0 <= _last_event(op).data["retry_after"] <= 40.0


@pytest.mark.django_db
@pytest.mark.parametrize("status", [429, 503])
def test_without_retry_after_the_backoff_grows_then_the_poll_recovers(
    server: ToolServer, faults: FaultTransport, status: int, settings
) -> None:
    settings.TOOLOPS_BACKOFF_BASE_SECONDS = 0.5
    op = submit_sleep(server, seconds=0.5, expect=State.WORKING)
    windows = []
    for _ in range(3):
        faults.inject(Fault("tasks/get", status))
        outcome, before = _poll_now(op)
        assert outcome == "poll_error"
        op.refresh_from_db()
        event = _last_event(op)
        assert event.data["retry_after"] is None
        windows.append(event.data["backoff_window_s"])
        delay = (op.next_poll_at - before).total_seconds()  # type: ignore[operator]
        lower = 0.1  # the peer's pollInterval (100 ms) is above the test floor
        assert lower <= delay <= lower + event.data["backoff_window_s"] + 0.5
    assert windows == [0.5, 1.0, 2.0]
    assert op.state == State.WORKING
    # Faults over: the row is polled to its receipt, and a success resets the error run.
    Operation.objects.filter(id=op.id).update(next_poll_at=timezone.now())
    run_embedded(until_idle=True, max_seconds=20)
    op.refresh_from_db()
    assert op.state == State.ACCEPTED


@pytest.mark.django_db
def test_wait_budget_exhausted_is_a_recorded_outcome_not_a_cancel(
    server: ToolServer, faults: FaultTransport, settings
) -> None:
    settings.TOOLOPS_WAIT_BUDGET_SECONDS = 1.5
    op = submit_sleep(server, seconds=30, expect=State.WORKING)
    stats = run_embedded(until_idle=True, max_seconds=15)
    op.refresh_from_db()
    assert op.state == State.RECONCILIATION_REQUIRED
    assert op.next_poll_at is None and op.lease_owner == ""
    event = OperationEvent.objects.get(operation=op, kind="reconciliation_required")
    assert event.data["reason"] == "wait_budget_exhausted"
    assert "tasks/cancel" not in faults.methods
    # Polling did happen, at the server's pace, and stopped at the budget.
    gets = faults.methods.count("tasks/get")
    assert 1 <= gets <= 1.5 / 0.1 + 2
    assert stats.outcomes.get("wait_budget_exhausted") == 1


@pytest.mark.django_db
def test_expiry_stops_polling_with_a_recorded_outcome(
    server: ToolServer, faults: FaultTransport
) -> None:
    op = submit_sleep(server, seconds=30, expect=State.WORKING)
    # The deadline the server's ttl would set, ahead of our own budget. (Set here rather than by
    # asking the peer for a short ttl: mcp 1.30 purges a task at its ttl while its work still runs,
    # and the late store then breaks the shared peer for later tests.)
    Operation.objects.filter(id=op.id).update(expires_at=timezone.now() + timedelta(seconds=1))
    run_embedded(until_idle=True, max_seconds=15)
    op.refresh_from_db()
    assert op.state == State.RECONCILIATION_REQUIRED
    event = OperationEvent.objects.get(operation=op, kind="reconciliation_required")
    assert event.data["reason"] == "expired"
    assert "tasks/cancel" not in faults.methods


def test_a_short_server_ttl_lowers_the_deadline(settings) -> None:
    from adapters.base import RemoteTask
    from toolops.services.observe import task_schedule_fields

    settings.TOOLOPS_WAIT_BUDGET_SECONDS = 3600.0
    now = timezone.now()
    op = Operation(expires_at=now + timedelta(hours=1), created_at=now)
    task = RemoteTask(remote_id="t", status="working", status_message=None, poll_interval_ms=100,
                      ttl_ms=1500, created_at=now.isoformat(), raw={})
    fields = task_schedule_fields(op=op, task=task, now=now)
    assert fields["expires_at"] == now + timedelta(milliseconds=1500)
    assert poll_deadline_reason(now=now + timedelta(seconds=2), created_at=now,
                                expires_at=fields["expires_at"]) == "expired"


@pytest.mark.django_db
def test_a_429_on_the_result_fetch_keeps_the_row_fetching(
    server: ToolServer, faults: FaultTransport
) -> None:
    op = submit_sleep(server, seconds=0.2, expect=State.WORKING)
    faults.inject(Fault("tasks/result", 429, {"Retry-After": "1"}))
    run_embedded(until_idle=True, max_seconds=20)
    op.refresh_from_db()
    assert op.state == State.ACCEPTED
    kinds = list(OperationEvent.objects.filter(operation=op).values_list("kind", flat=True))
    assert "result_fetch_error" in kinds
    assert kinds.index("result_fetch_error") < kinds.index("result_fetched")


@pytest.mark.django_db
def test_a_202_accepted_answer_never_counts_as_completion(
    server: ToolServer, faults: FaultTransport
) -> None:
    op = submit_sleep(server, seconds=30, expect=State.WORKING)
    faults.inject(Fault("tasks/get", 202))
    outcome, _ = _poll_now(op)
    assert outcome == "poll_error"
    op.refresh_from_db()
    assert op.state == State.WORKING and op.terminal_status == ""
    assert _last_event(op).data["detail"]["http_status"] == 202
