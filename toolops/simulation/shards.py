"""One simulation run: in this process, or split into shard processes, then one verdict.

A shard owns whole simulated servers and the series they serve, with its own virtual clock and
its own dispatcher that claims only its servers' rows (toolops.simulation.runner). Every server
sees exactly the load it would see in an unsplit run, and every plan is the same, so splitting
changes how fast a run goes, not what it tests.

`--shards N` starts N shard processes on the same database (each one `toolops simulate --shard
k/N --shard-report FILE`), waits for them, and judges the whole run here: the per-series
verdicts come from the shards, the gate is read once over every row of the run, on a clock set
to the latest shard's end. Each shard with one poll thread is sequential, so a shard replays call
for call (`--shard k/N --workers 1`); several threads per shard overlap database round trips
but make the order inside a tick the scheduler's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from toolops.errors import ToolopsError
from toolops.qps import BucketStats, LocalTokenBucket, qps_bucket_replace, server_bucket_key
from toolops.services.connections import adapters_close_all, connections_use_transport
from toolops.services.gate import GateReport, gate_report
from toolops.simulation.clock import VirtualClock, virtual_time
from toolops.simulation.progress import SimProgress
from toolops.simulation.runner import SERVER_QPS, _Run, run_tag, servers_for


@dataclass
class ShardOutcome:
    """What one shard hands back: its verdicts and what the gate needs that only it knows."""

    shard: int
    shards: int
    virtual_seconds: float
    polls: int
    failing: dict[int, list[str]]
    truth: dict[str, str]  # submission key -> the status its receipt must carry
    peer_counts: dict[str, int]  # submission key -> operations the server created for it
    fault_counts: dict[str, int]
    peak_polls: int  # the servers' own count: most tasks/get in one virtual second
    peak_requests: int  # ... and most requests of any kind
    server_names: list[str] = field(default_factory=list)
    bucket_stats: dict[int, dict[str, Any]] = field(default_factory=dict)  # server pk -> stats

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ShardOutcome:
        raw = json.loads(text)
        raw["failing"] = {int(k): v for k, v in raw["failing"].items()}
        raw["bucket_stats"] = {int(k): v for k, v in raw["bucket_stats"].items()}
        return cls(**raw)


@dataclass
class SimResult:
    seed: int
    series: int
    only: int | None
    virtual_seconds: float
    gate: GateReport
    server_peak_over_qps: float
    server_peak_requests_over_qps: float
    failing: dict[int, list[str]]
    fault_counts: dict[str, int]
    polls: int
    shards: int = 1
    servers: int | None = None  # given explicitly (otherwise one per SERIES_PER_SERVER series)
    # The buckets' own counts over every server: requests granted a token, and takes refused
    # (each refusal hands a claimed row back; many per call means claims spent on no request).
    qps_granted: int = 0
    qps_denied: int = 0

    @property
    def passed(self) -> bool:
        return (self.gate.passed and not self.failing and self.server_peak_over_qps <= 1.0
                and self.server_peak_requests_over_qps <= 1.0)

    def _base_command(self) -> str:
        servers = f" --servers {self.servers}" if self.servers else ""
        return f"python manage.py toolops simulate --series {self.series} --seed {self.seed}{servers}"

    def replay_command(self, index: int) -> str:
        return f"{self._base_command()} --only {index}"

    def shard_replay_command(self, index: int) -> str | None:
        """The failing series' whole shard, sequential (the same plans, servers and load)."""
        if self.shards <= 1:
            return None
        shard = (index % servers_for(series=self.series, servers=self.servers)) % self.shards
        return f"{self._base_command()} --shard {shard}/{self.shards} --workers 1"


def _sim_session_setup(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """The simulation's sessions commit without waiting for the WAL flush.

    The run points at a scratch database and is judged by what the ledger says once it ends,
    never after a crash, so the flush buys nothing here; transactions, row locks and constraints
    behave exactly as with a synchronous commit (only durability across a server crash differs).
    On a busy machine the flush is most of each commit's time.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET synchronous_commit TO off")


def simulate_shard(*, series: int, seed: int, shard: int = 0, shards: int = 1, tag: str | None = None,
                   only: int | None = None, lie_about_series: frozenset[int] = frozenset(),
                   workers: int = 1, judge: bool = True, servers: int | None = None,
                   on_progress: Callable[[SimProgress], None] | None = None,
                   ) -> tuple[ShardOutcome, GateReport | None]:
    """Run one shard (the whole run when `shards` is 1) in this process; with `judge`, also the
    gate over its rows (a shard process leaves that to the parent, which reads every shard's)."""
    run = _Run(series=series, seed=seed, only=only, lie_about_series=lie_about_series,
               workers=1 if only is not None else workers, shard=shard, shards=shards, tag=tag,
               servers=servers, on_progress=None if only is not None else on_progress)
    bucket = LocalTokenBucket()
    qps_bucket_replace(bucket)  # the embedded bucket, on the virtual clock below
    connection_created.connect(_sim_session_setup)
    if connection.connection is not None:
        _sim_session_setup(sender=None, connection=connection)
    gate = None
    try:
        with virtual_time(run.clock, seed=seed):
            run.register_servers()
            transports = run.transports
            connections_use_transport(lambda server: transports.get(server.pk))
            run.loop()
            truth, counts, failing = run.verdict()
            if judge:
                gate = gate_report(server_names=[s.name for s in run.servers], ground_truth=truth,
                                   peer_counts=counts)
    finally:
        connection_created.disconnect(_sim_session_setup)
        if run.pool is not None:
            run.pool.close()
        connections_use_transport(None)
        adapters_close_all()
        qps_bucket_replace(None)
    faults: dict[str, int] = {}
    for plan in run.plans.values():
        for name in plan.faults():
            faults[name] = faults.get(name, 0) + 1
    faults.update(run.extra.summary())
    outcome = ShardOutcome(
        shard=shard, shards=shards, virtual_seconds=round(run.clock.now_s(), 3), polls=run.polls,
        failing=failing, truth=truth, peer_counts=dict(counts), fault_counts=faults,
        # The server's own count, beside the bucket's (the gate figure): polls (tasks/get) per
        # virtual second against the cap, and every request of any kind; both must stay within
        # it (each HTTP request spends its own token: connections.server_request_gate).
        peak_polls=max((max(s.polls_per_second.values(), default=0) for s in run.sims), default=0),
        peak_requests=max((max(s.requests_per_second.values(), default=0) for s in run.sims),
                          default=0),
        server_names=[s.name for s in run.servers],
        bucket_stats={s.pk: asdict(bucket.stats(key=server_bucket_key(server_id=s.pk)))
                      for s in run.servers},
    )
    return outcome, gate


def _result(*, seed: int, series: int, only: int | None, outcome: ShardOutcome,
            gate: GateReport, servers: int | None) -> SimResult:
    return SimResult(
        seed=seed, series=series, only=only, virtual_seconds=outcome.virtual_seconds, gate=gate,
        server_peak_over_qps=round(outcome.peak_polls / SERVER_QPS, 4),
        server_peak_requests_over_qps=round(outcome.peak_requests / SERVER_QPS, 4),
        failing=outcome.failing, fault_counts=dict(sorted(outcome.fault_counts.items())),
        polls=outcome.polls, shards=outcome.shards, servers=servers,
        qps_granted=sum(int(b.get("total", 0)) for b in outcome.bucket_stats.values()),
        qps_denied=sum(int(b.get("denied", 0)) for b in outcome.bucket_stats.values()))


def simulate(*, series: int, seed: int, only: int | None = None,
             lie_about_series: frozenset[int] = frozenset(), workers: int = 1, shards: int = 1,
             shard: int | None = None, servers: int | None = None,
             on_progress: Callable[[SimProgress], None] | None = None) -> SimResult:
    """Run the simulation in the configured database and return its verdict with the gate.

    `shards` > 1 (and no `only`): that many shard processes; `shard`: only that shard of
    `shards`, here."""
    if only is not None and not 0 <= only < series:
        raise ToolopsError(f"--only must be within 0..{series - 1}")
    shards = max(1, min(shards, servers_for(series=series, servers=servers)))
    if shard is not None and not 0 <= shard < shards:
        raise ToolopsError(f"--shard must be within 0..{shards - 1} of {shards}")
    if shards > 1 and only is None and shard is None:
        return _simulate_in_processes(series=series, seed=seed, shards=shards, workers=workers,
                                      lie_about_series=lie_about_series, servers=servers)
    outcome, gate = simulate_shard(
        series=series, seed=seed, only=only, lie_about_series=lie_about_series, workers=workers,
        shard=shard or 0, shards=shards if shard is not None else 1, servers=servers,
        on_progress=on_progress)
    assert gate is not None
    return _result(seed=seed, series=series, only=only, outcome=outcome, gate=gate,
                   servers=servers)


def shard_report_write(*, path: str, series: int, seed: int, shard: int, shards: int, tag: str,
                       workers: int, lie_about_series: frozenset[int], servers: int | None,
                       on_progress: Callable[[SimProgress], None] | None) -> None:
    """A shard process's whole job: run its shard and leave its outcome in `path` for the parent."""
    outcome, _ = simulate_shard(series=series, seed=seed, shard=shard, shards=shards, tag=tag,
                                workers=workers, lie_about_series=lie_about_series, judge=False,
                                servers=servers, on_progress=on_progress)
    Path(path).write_text(outcome.to_json())


def _simulate_in_processes(*, series: int, seed: int, shards: int, workers: int,
                           lie_about_series: frozenset[int], servers: int | None) -> SimResult:
    tag = run_tag(seed=seed)
    env = _shard_env()
    with tempfile.TemporaryDirectory(prefix="toolops-sim-") as tmp:
        reports = [Path(tmp) / f"shard-{k}.json" for k in range(shards)]
        procs = []
        for k, report in enumerate(reports):
            argv = [sys.executable, "-m", "django", "toolops", "simulate", "--series", str(series),
                    "--seed", str(seed), "--workers", str(workers), "--shard", f"{k}/{shards}",
                    "--tag", tag, "--shard-report", str(report)]
            for index in sorted(lie_about_series):
                argv += ["--inject-lie", str(index)]
            if servers:
                argv += ["--servers", str(servers)]
            # stderr is inherited: each shard's progress lines go straight to ours.
            procs.append(subprocess.Popen(argv, cwd=settings.BASE_DIR, env=env,
                                          stdout=subprocess.DEVNULL))
        codes = [p.wait() for p in procs]
        bad = [k for k, code in enumerate(codes) if code != 0 or not reports[k].exists()]
        if bad:
            raise ToolopsError(f"simulation shard(s) {bad} of {shards} failed (exit codes {codes})")
        outcomes = [ShardOutcome.from_json(r.read_text()) for r in reports]
    merged = _merge(outcomes)
    return _result(seed=seed, series=series, only=None, outcome=merged,
                   gate=_gate_over_shards(merged=merged, seed=seed), servers=servers)


def _shard_env() -> dict[str, str]:
    """The shard processes' environment: the project's settings, on this process's database
    (whatever settings module and database name this process runs with, a test's included)."""
    db = connection.settings_dict
    if connection.vendor != "postgresql":
        raise ToolopsError("--shards needs PostgreSQL (several processes write the ledger at once)")
    user = quote(str(db.get("USER") or ""))
    password = quote(str(db.get("PASSWORD") or ""))
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    url = f"postgres://{auth}{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "DATABASE_URL": url}


def _merge(outcomes: list[ShardOutcome]) -> ShardOutcome:
    merged = ShardOutcome(shard=0, shards=len(outcomes), virtual_seconds=0.0, polls=0, failing={},
                          truth={}, peer_counts={}, fault_counts={}, peak_polls=0, peak_requests=0)
    for o in outcomes:
        merged.virtual_seconds = max(merged.virtual_seconds, o.virtual_seconds)
        merged.polls += o.polls
        merged.failing.update(o.failing)
        merged.truth.update(o.truth)
        merged.peer_counts.update(o.peer_counts)
        for name, n in o.fault_counts.items():
            merged.fault_counts[name] = merged.fault_counts.get(name, 0) + n
        merged.peak_polls = max(merged.peak_polls, o.peak_polls)
        merged.peak_requests = max(merged.peak_requests, o.peak_requests)
        merged.server_names += o.server_names
        merged.bucket_stats.update(o.bucket_stats)
    merged.failing = dict(sorted(merged.failing.items()))
    return merged


def _gate_over_shards(*, merged: ShardOutcome, seed: int) -> GateReport:
    """The gate over every row of the run, read here once all shards are done.

    Timestamps are virtual; the clock is set to the latest shard's end, so a row still open in a
    shard that ended earlier is judged as having waited until then (never less than it did). The
    QPS figure reads the shards' own bucket counts, loaded into an embedded bucket."""
    bucket = LocalTokenBucket()
    for server_pk, raw in merged.bucket_stats.items():
        bucket.stats_load(key=server_bucket_key(server_id=server_pk), stats=BucketStats(**raw))
    qps_bucket_replace(bucket)
    try:
        with virtual_time(VirtualClock(start_s=merged.virtual_seconds), seed=seed):
            return gate_report(server_names=merged.server_names, ground_truth=merged.truth,
                               peer_counts=merged.peer_counts)
    finally:
        qps_bucket_replace(None)


def result_summary(result: SimResult) -> dict[str, Any]:
    return {"seed": result.seed, "series": result.series, "only": result.only,
            "shards": result.shards, "virtual_seconds": result.virtual_seconds,
            "polls": result.polls, "qps_granted": result.qps_granted,
            "qps_denied": result.qps_denied, "server_peak_polls_over_qps": result.server_peak_over_qps,
            "server_peak_requests_over_qps": result.server_peak_requests_over_qps,
            "fault_counts": result.fault_counts,
            "failing_series": len(result.failing), "passed": result.passed}
