"""A run split into shard processes on one PostgreSQL database, judged once over every row."""

from __future__ import annotations

import pytest

from ledger.models import Operation, ToolServer
from toolops.simulation.shards import ShardOutcome, simulate

pytestmark = pytest.mark.django_db(transaction=True)

SEED = 20261129


def test_two_shard_processes_run_every_series_once_and_one_gate_judges_them() -> None:
    result = simulate(series=40, seed=SEED, servers=2, shards=2, workers=1)
    assert result.passed, result.failing
    assert result.shards == 2
    # Each shard registered its own server; every series ran on its server (i % 2), once.
    servers = dict(ToolServer.objects.filter(name__startswith=f"sim{SEED}r")
                   .values_list("pk", "name"))
    assert sorted(servers.values()) == [f"sim{SEED}r0-s0", f"sim{SEED}r0-s1"]
    nodes = {node: servers[server] for node, server in Operation.objects.filter(
        server__in=servers).values_list("call_node_id", "server")}
    assert {int(n.rsplit("-", 1)[1]) for n in nodes} == set(range(40))
    assert all(name.endswith(f"-s{int(node.rsplit('-', 1)[1]) % 2}") for node, name in nodes.items())
    # The gate read both shards' rows: 40 call nodes, each with its receipt.
    assert result.gate.figure("terminal_divergence").detail["receipts"] >= 40
    assert result.gate.figure("outbox_traceable_share").detail["outbox_rows"] >= 40


def test_a_divergence_in_one_shard_fails_the_whole_run_with_both_replays() -> None:
    result = simulate(series=12, seed=SEED, servers=2, shards=2, workers=1,
                      lie_about_series=frozenset({3}))
    assert not result.passed
    assert set(result.failing) == {3}
    assert result.gate.figure("terminal_divergence").value == 1
    assert result.shard_replay_command(3) == (
        f"python manage.py toolops simulate --series 12 --seed {SEED} --servers 2 "
        "--shard 1/2 --workers 1")
    # The failing series' report ends with what its row went through.
    assert any(p.startswith("events of ") and "accepted" in p for p in result.failing[3])


def test_one_shard_replays_alone_with_the_same_plans() -> None:
    whole = simulate(series=12, seed=SEED, servers=2, shard=1, shards=2, workers=1)
    assert whole.passed, whole.failing
    # Shard 1 of 2 owns server 1 and the odd series only.
    nodes = set(Operation.objects.values_list("call_node_id", flat=True))
    assert {int(n.rsplit("-", 1)[1]) for n in nodes} == {1, 3, 5, 7, 9, 11}


def test_a_shard_outcome_survives_its_trip_through_json() -> None:
    outcome = ShardOutcome(shard=1, shards=2, virtual_seconds=1.5, polls=3, failing={7: ["x"]},
                           truth={"k": "completed"}, peer_counts={"k": 1}, fault_counts={"f": 1},
                           peak_polls=2, peak_requests=3, server_names=["a"],
                           bucket_stats={5: {"total": 1}})
    assert ShardOutcome.from_json(outcome.to_json()) == outcome
