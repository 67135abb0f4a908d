"""Beat's scheduler (toolops/beat.py): with less than Celery's 10 ms drift left before a run,
it returns a time to sleep, where Celery's own scheduler returns one <= 0 and beat's loop calls
it again without sleeping (a busy loop); otherwise both wake at the same time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from celery import Celery
from celery.beat import PersistentScheduler
from celery.schedules import schedule

from toolops.beat import SleepingScheduler

NOW = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)
EVERY = 0.25  # the dispatcher's tick


def _now() -> datetime:  # a module-level function: the persistent scheduler pickles its entries
    return NOW


def _tick(cls: type[PersistentScheduler], *, ran_ago: float, tmp_path: Path) -> float:
    """One tick of a scheduler whose only entry, every EVERY s, last ran `ran_ago` s before NOW."""
    app = Celery("beat-test", set_as_current=False)
    app.conf.result_expires = None  # no default backend-cleanup entry: the tick is the only one
    app.conf.beat_schedule = {"tick": {"task": "toolops.dispatch_due",
                                       "schedule": schedule(timedelta(seconds=EVERY), nowfun=_now)}}
    sched = cls(app=app, schedule_filename=str(tmp_path / cls.__name__), lazy=True)
    sched.setup_schedule()
    sched.schedule["tick"].last_run_at = NOW - timedelta(seconds=ran_ago)
    try:
        return sched.tick()  # type: ignore[no-any-return]
    finally:
        sched.close()


def test_with_less_than_the_drift_left_it_sleeps_where_celerys_scheduler_would_spin(tmp_path: Path) -> None:
    left = 0.004
    assert _tick(PersistentScheduler, ran_ago=EVERY - left, tmp_path=tmp_path) <= 0  # the spin
    assert _tick(SleepingScheduler, ran_ago=EVERY - left, tmp_path=tmp_path) == pytest.approx(left)


def test_with_more_left_it_wakes_early_by_the_drift_as_celerys_does(tmp_path: Path) -> None:
    ours = _tick(SleepingScheduler, ran_ago=0.1, tmp_path=tmp_path)
    assert ours == pytest.approx(_tick(PersistentScheduler, ran_ago=0.1, tmp_path=tmp_path))
    assert ours == pytest.approx(EVERY - 0.1 - 0.010)


def test_the_projects_beat_uses_it() -> None:
    from config.celery import app

    assert app.conf.beat_scheduler == "toolops.beat:SleepingScheduler"
