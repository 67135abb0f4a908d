"""The seeded simulation on PostgreSQL: 500 series must pass the gate; a lying server is caught."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.models import OperationEvent
from toolops.services import inputs
from toolops.services.connections import RateLimited
from toolops.simulation.plan import series_plan
from toolops.simulation.shards import simulate

pytestmark = pytest.mark.django_db(transaction=True)

SEED = 20261129


def test_plans_are_a_function_of_seed_and_index() -> None:
    a = series_plan(seed=SEED, index=7, arrival_per_s=1.2)
    assert a == series_plan(seed=SEED, index=7, arrival_per_s=1.2)
    assert a != series_plan(seed=SEED + 1, index=7, arrival_per_s=1.2)
    faults = set()
    for i in range(500):
        faults.update(series_plan(seed=SEED, index=i, arrival_per_s=1.2).faults())
    # 500 series hold every fault kind the plan knows.
    assert faults == {"lost_create", "throttle", "cancel_at_s", "cancel_ack_lost", "input_after_s",
                      "replay_input", "result_fault", "stale_after_terminal", "wrong_task_id",
                      "epoch_roll", "forget_before_ttl", "foreign_task_id", "expire_after_s"}


def test_500_series_pass_the_gate() -> None:
    result = simulate(series=500, seed=SEED, workers=2)
    assert result.failing == {}, {i: p for i, p in list(result.failing.items())[:5]}
    assert result.gate.passed, result.gate.as_dict()
    assert result.server_peak_over_qps <= 1.0
    # Every request the server saw, key lookups included, stayed within its cap.
    assert result.server_peak_requests_over_qps <= 1.0
    figures = {f.name: f for f in result.gate.figures}
    # The run really exercised what the figures measure.
    assert figures["cancel_confirmation_p99_ms"].detail["cancels"] > 50
    assert figures["unknown_resolved_or_queued_s"].detail["spells"] > 10
    assert figures["outbox_traceable_share"].detail["outbox_rows"] >= 500
    assert figures["terminal_divergence"].detail["receipts"] >= 500
    # The three later faults fired and left their records: a refused stale worker, a refused
    # foreign task id, a forgotten task queued as UNKNOWN and resolved by the operator.
    counts = result.fault_counts
    assert counts["stale_epoch_refused"] == counts["epoch_rolled_in_flight"] > 0
    assert counts["foreign_task_id_refused"] > 0
    assert counts["operator_accepted"] >= counts["forgotten_to_queue"] > 0
    # Short ttls: some rows were accepted before the expiry mattered, some polled after it (404
    # or their own copy of the expiry) and were queued, then settled by the operator.
    assert counts["expired_after_receipt"] > 0 and counts["expired_to_queue"] > 0
    assert counts["operator_accepted"] >= counts["forgotten_to_queue"] + counts["expired_to_queue"]


def test_a_lying_server_is_a_divergence_with_a_replay_command() -> None:
    result = simulate(series=30, seed=SEED, lie_about_series=frozenset({4}))
    assert not result.passed
    assert set(result.failing) == {4}
    assert result.gate.figure("terminal_divergence").value == 1
    assert result.replay_command(4) == (
        f"python manage.py toolops simulate --series 30 --seed {SEED} --only 4")


def test_only_replays_one_series_alone() -> None:
    result = simulate(series=30, seed=SEED, only=4)
    assert result.passed, result.failing
    assert result.gate.figure("outbox_traceable_share").detail["outbox_rows"] == 1


def test_command_prints_the_replay_command_and_exits_non_zero() -> None:
    from io import StringIO

    from django.core.management import call_command

    out, err = StringIO(), StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("toolops", "simulate", "--series", "12", "--seed", str(SEED), "--workers", "1",
                     "--inject-lie", "3", stdout=out, stderr=err)
    assert exited.value.code == 1
    assert f"python manage.py toolops simulate --series 12 --seed {SEED} --only 3" in err.getvalue()
    assert "terminal_divergence" in out.getvalue() and "FAIL" in out.getvalue()


def test_an_answer_not_delivered_for_want_of_a_token_is_answered_again(monkeypatch) -> None:
    """Every other delivery of an answer is refused for want of a QPS token (nothing sent): the
    answer stays recorded, the round is no longer open, and the simulated operator answers again
    with the same JSON, as the refusal says; every series still settles."""
    real = inputs.server_call
    deliveries = itertools.count()

    def every_other_delivery_refused(*, server, purpose, fn, **kwargs):  # type: ignore[no-untyped-def]
        if purpose == "input" and next(deliveries) % 2 == 0:
            raise RateLimited(server_id=server.pk, purpose=purpose,
                              retry_at=timezone.now() + timedelta(seconds=1))
        return real(server=server, purpose=purpose, fn=fn, **kwargs)

    monkeypatch.setattr(inputs, "server_call", every_other_delivery_refused)
    result = simulate(series=60, seed=SEED, workers=1)
    assert result.failing == {}, {i: p for i, p in list(result.failing.items())[:5]}
    assert result.gate.passed, result.gate.as_dict()
    assert OperationEvent.objects.filter(kind="input_delivery_failed").count() > 0
