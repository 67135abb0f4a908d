"""The simulation runner: N seeded series through the real services on a virtual clock.

Single-threaded on purpose: the order of every call is a function of the seed, so a failing
series replays alone (`--only I`). Concurrency between a series' own actors (the dispatcher's
poll, the caller's cancel, the operator's answer) is interleaved in virtual time, at the same
virtual instant where the plan says so (a cancel sent the second the work completes), which is
what the guards in SQL must order; thread-level races are the fault-injection tests' business.

Each tick: start due series (operation_submit), fire due cancels (operation_cancel), answer due
input rounds (operation_answer_input), re-submit call nodes proven never created, claim and poll
due rows (operations_claim_due + operation_poll), then jump the clock to the next thing due.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from django.utils import timezone

from adapters.mcp_tasks_2025 import McpTasks2025Adapter
from ledger.errors import LedgerError
from ledger.models import Operation, OperationEvent, ToolServer
from ledger.selectors.inputs import input_rounds_waiting
from ledger.states import OPEN, State
from toolops.errors import ToolopsError
from toolops.services.boundary import operations_load_for_poll
from toolops.services.cancel import operation_cancel
from toolops.services.dispatch import (
    ledger_statistics_refresh,
    operations_claim_due,
    operations_next_due_at,
)
from toolops.services.inputs import input_rounds_expire_due, operation_answer_input
from toolops.services.observe import operation_poll
from toolops.services.servers import _tools_table
from toolops.services.submit import operation_submit
from toolops.simulation.clock import VirtualClock
from toolops.simulation.faults_extra import ExtraFaults
from toolops.simulation.plan import SeriesPlan, series_plan
from toolops.simulation.pool import PollPool
from toolops.simulation.progress import SimProgress, progress_snapshot, progress_step
from toolops.simulation.server import EPOCH, TOOL, SimServer, SimTransport

# Load shape: series arrive at ARRIVAL_PER_SERVER_S per server, each server capped at SERVER_QPS
# and asking for POLL_INTERVAL_MS between polls. A series costs ~work/interval + 3 requests
# (about 12), so 1.2 series/s per server asks ~15 requests/s of a 20 QPS cap: loaded, not
# saturated, so every series ends and the cap is exercised by the bursts.
SERVER_QPS = 20.0
POLL_INTERVAL_MS = 3000
ARRIVAL_PER_SERVER_S = 1.2
SERIES_PER_SERVER = 1250
# Periodic sweeps (answers, re-submits, expiry) run once per virtual second.
SWEEP_S = 1.0
# A run that has not settled this long after its last start is stuck: stop and report.
SETTLE_LIMIT_S = 5400.0  # beyond the input deadline (1 h) and the UNKNOWN deadline (15 min)
# The clock moves at least this far per tick, so rows due within one window are claimed and
# polled together (in parallel with --workers); a real dispatcher's tick is coarser still.
MIN_STEP_S = 0.1
# A sequential run (one poll thread) polls a tick's rows one after another at one virtual
# instant, so each server's bucket serves about one of them per tick: the step must stay under
# one token interval of a simulated server (1.1 / SERVER_QPS = 55 ms), or the load the plans
# offer (about 15 requests/s per server) exceeds what a tick can serve and rows queue up.
SEQUENTIAL_STEP_S = 0.05
# An operator retries an undelivered answer this many times (once per sweep) before giving up.
ANSWER_RETRIES = 30
# Longer than any series runs (SETTLE_LIMIT_S): only the short-ttl fault sees an expiry.
DEFAULT_TTL_MS = 3_600_000


@dataclass
class SeriesOutcome:
    index: int
    keys: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _ttl_ms(plan: SeriesPlan) -> int:
    if plan.expire_after_s is None:
        return DEFAULT_TTL_MS
    return int((plan.work_s + plan.expire_after_s) * 1000)


def _key(tag: str, index: int, attempt: int) -> str:
    return hashlib.sha256(f"{tag}:{index}:{attempt}".encode()).hexdigest()[:40]


def servers_for(*, series: int, servers: int | None = None) -> int:
    """How many simulated servers a run of `series` has (series i is served by server i % n):
    `servers` when given, else one per SERIES_PER_SERVER series."""
    return max(1, servers or math.ceil(series / SERIES_PER_SERVER))


def run_tag(*, seed: int) -> str:
    """The next run's tag in this database (server names and call nodes start with it)."""
    return f"sim{seed}r{ToolServer.objects.filter(name__startswith=f'sim{seed}r').count()}"


class _Run:
    def __init__(self, *, series: int, seed: int, only: int | None,
                 lie_about_series: frozenset[int], workers: int, shard: int = 0, shards: int = 1,
                 tag: str | None = None, servers: int | None = None,
                 on_progress: Callable[[SimProgress], None] | None = None) -> None:
        self.series, self.seed, self.only = series, seed, only
        self.on_progress = on_progress
        self.clock = VirtualClock()
        n_servers = servers_for(series=series, servers=servers)
        self.n_servers = n_servers
        self.tag = tag or run_tag(seed=seed)
        self.lie_about_series = lie_about_series
        # A shard owns whole servers (server k belongs to shard k % shards) and the series they
        # serve, on a clock of its own: every server sees the load it would in a run of one
        # shard, and nothing one shard does (a claim, an expiry sweep) touches another's rows.
        self.sims_by_k = {k: SimServer(name=f"{self.tag}-s{k}", clock=self.clock.now_s,
                                       poll_interval_ms=POLL_INTERVAL_MS)
                          for k in range(n_servers) if k % shards == shard}
        self.sims = list(self.sims_by_k.values())
        # Arrivals as in the whole run, so a plan does not depend on how the run is split.
        arrival = ARRIVAL_PER_SERVER_S * n_servers
        indexes = [only] if only is not None else [
            i for i in range(series) if (i % n_servers) % shards == shard]
        self.progress_every = progress_step(series=len(indexes))
        self.next_progress = self.progress_every
        self.plans = {i: series_plan(seed=seed, index=i, arrival_per_s=arrival) for i in indexes}
        self.outcomes = {i: SeriesOutcome(index=i) for i in indexes}
        self.op_index: dict[uuid.UUID, int] = {}
        self.current: dict[int, uuid.UUID] = {}
        self.attempts: dict[int, int] = {}
        self.answered: set[int] = set()
        self.answer_errors: dict[int, int] = {}
        self.polls = 0
        self.loaded: dict[uuid.UUID, Operation] = {}  # this tick's claimed rows, read at once
        self.servers: list[ToolServer] = []
        self.pool: PollPool | None = PollPool(workers=workers, fn=self.poll_one) if workers > 1 else None
        self.step_s = MIN_STEP_S if self.pool is not None else SEQUENTIAL_STEP_S
        self.transports: dict[int, SimTransport] = {}
        self.polling = threading.local()  # set while this thread runs a dispatcher poll
        self.extra = ExtraFaults(self)  # epoch roll, forgotten task, the reconciling operator

    # -- setup ---------------------------------------------------------------------------

    def register_servers(self) -> None:
        for sim in self.sims:
            url = f"http://{sim.name}.sim.invalid/mcp"
            transport = SimTransport(sim)
            with McpTasks2025Adapter(url=url, transport=transport) as adapter:
                negotiated = adapter.negotiate()
                tools = adapter.list_tools()
            server = ToolServer.objects.create(
                name=sim.name, url=url, adapter_version=McpTasks2025Adapter.version,
                protocol_version=negotiated.protocol_version, capabilities=negotiated.capabilities,
                server_info=negotiated.server_info, session_id=negotiated.session_id or "",
                tools=_tools_table(tools), max_qps=SERVER_QPS, negotiated_at=timezone.now())
            self.servers.append(server)
            self.transports[server.pk] = transport

    def sim_for(self, index: int) -> SimServer:
        return self.sims_by_k[index % self.n_servers]

    @property
    def server_ids(self) -> list[int]:
        return [s.pk for s in self.servers]

    # -- actors --------------------------------------------------------------------------

    def submit(self, plan: SeriesPlan) -> None:
        attempt = self.attempts.get(plan.index, 0) + 1
        self.attempts[plan.index] = attempt
        key = _key(self.tag, plan.index, attempt)
        sim = self.sim_for(plan.index)
        sim.plans[key] = plan
        if plan.index in self.lie_about_series:
            sim.lie_about = sim.lie_about | {key}
        self.outcomes[plan.index].keys.append(key)
        try:
            op = operation_submit(server_name=sim.name, tool_name=TOOL,
                                  call_node_id=f"{self.tag}-{plan.index}",
                                  arguments={"series": plan.index}, ttl_ms=_ttl_ms(plan),
                                  submission_key=key)
            op_id = op.id
        except (ToolopsError, LedgerError) as exc:
            # The row may still exist (committed before the send): the dispatcher owns it now.
            self.outcomes[plan.index].errors.append(f"submit: {exc}")
            found = Operation.objects.filter(submission_key=key).values_list("id", flat=True).first()
            if found is None:
                return
            op_id = found
        self.op_index[op_id] = plan.index
        self.current[plan.index] = op_id

    def cancel(self, index: int) -> None:
        op_id = self.current.get(index)
        if op_id is None:
            return
        try:
            operation_cancel(operation_id=op_id)
        except (ToolopsError, LedgerError):
            pass  # refused (already terminal, or not cancellable): recorded by the service

    def sweep(self, now_s: float) -> float | None:
        """Answers, re-submits and expiry; returns when the next answer falls due."""
        server_ids = self.server_ids
        input_rounds_expire_due(server_ids=server_ids)
        # As the fleet's dispatcher tick does: the ledger starts empty and grows through the run.
        ledger_statistics_refresh()
        next_answer: float | None = None
        # Only rows waiting for input: a round left open on a row that went to the queue is not
        # answerable (the operator settles the row there instead). A round whose answer was
        # recorded but not delivered is answered again with the same JSON, as the refusal says.
        rounds = input_rounds_waiting().filter(operation__state=State.INPUT_REQUIRED,
                                               operation__server_id__in=server_ids).values_list(
            "id", "operation_id", "round", "schema_digest", "created_at")
        for ir_id, op_id, rnd, digest, created in sorted(rounds, key=lambda r: r[0]):
            index = self.op_index.get(op_id)
            if index is None or ir_id in self.answered:
                continue
            due = (created - EPOCH).total_seconds() + self.plans[index].answer_delay_s
            if due > now_s:
                next_answer = due if next_answer is None else min(next_answer, due)
                continue
            try:
                operation_answer_input(operation_id=op_id, input_round=rnd, schema_digest=digest,
                                       response={"ok": True})
                self.answered.add(ir_id)
            except (ToolopsError, LedgerError) as exc:
                # "recorded but not delivered" (no QPS token, server busy): the operator's way is
                # to answer again with the same JSON, which is what the next sweep does.
                self.answer_errors[ir_id] = self.answer_errors.get(ir_id, 0) + 1
                if self.answer_errors[ir_id] >= ANSWER_RETRIES:
                    self.answered.add(ir_id)
                    self.outcomes[index].errors.append(f"answer round {rnd}: {exc}")
        # Matched to each series' latest attempt here, not in SQL: an IN list of every started
        # series' attempt would be sent and parsed again every virtual second.
        current = set(self.current.values())
        never = [i for i in Operation.objects.filter(server_id__in=server_ids, state=State.NOT_FOUND_SAFE)
                 .values_list("id", flat=True) if i in current]
        for op_id in sorted(never, key=lambda i: self.op_index[i]):
            index = self.op_index[op_id]
            if self.attempts.get(index, 0) < 3:
                self.submit(self.plans[index])  # proven never created: a new attempt, a new key
        return min((t for t in (next_answer, self.extra.operator_sweep(now_s)) if t is not None),
                   default=None)

    def poll_one(self, op_id: uuid.UUID) -> None:
        self.polling.active = True  # SimServer.may_roll: this thread's requests are a poll's
        if self.pool is not None:
            self.clock.work_begins()
        try:
            operation_poll(operation_id=op_id, lease_owner="sim-dispatcher",
                           loaded=self.loaded.get(op_id))
        except Exception as exc:  # a crash is a finding: record it on the series, go on
            index = self.op_index.get(op_id)
            if index is not None:
                self.outcomes[index].errors.append(f"poll crashed: {type(exc).__name__}: {exc}")
        finally:
            self.polling.active = False
            if self.pool is not None:
                self.clock.work_ends()

    def dispatch(self) -> int:
        ids = sorted(operations_claim_due(owner="sim-dispatcher", server_ids=self.server_ids),
                     key=lambda i: self.op_index.get(i, -1))
        # Read as a fleet worker reads its batch: in one statement before the polls.
        self.loaded = operations_load_for_poll(operation_ids=ids)
        if self.pool is None or len(ids) < 2:
            for op_id in ids:
                self.poll_one(op_id)
        else:
            self.pool.run(ids)
        self.polls += len(ids)
        return len(ids)

    def open_rows(self) -> int:
        return Operation.objects.filter(server__in=self.servers, state__in=OPEN).count()

    # -- the loop ------------------------------------------------------------------------

    def loop(self) -> None:
        starts = sorted(self.plans.values(), key=lambda p: (p.start_s, p.index))
        cursor = 0
        actions: list[tuple[float, int]] = []
        last_start = starts[-1].start_s if starts else 0.0
        next_sweep = 0.0
        next_answer: float | None = None
        open_rows = 0
        while True:
            now = self.clock.now_s()
            while cursor < len(starts) and starts[cursor].start_s <= now:
                plan = starts[cursor]
                cursor += 1
                self.submit(plan)
                if plan.cancel_at_s is not None:
                    heapq.heappush(actions, (plan.start_s + plan.cancel_at_s, plan.index))
            while actions and actions[0][0] <= now:
                self.cancel(heapq.heappop(actions)[1])
            if now >= next_sweep:
                next_answer = self.sweep(now)
                open_rows = self.open_rows()
                self.report_progress(settled=cursor - open_rows)
                next_sweep = now + SWEEP_S
            claimed = self.dispatch()
            if claimed and claimed >= 200:
                continue  # a full batch: more may be due at this very instant
            if cursor >= len(starts) and not actions and open_rows == 0 and now >= next_sweep - SWEEP_S:
                if self.open_rows() == 0:
                    return
            if now > last_start + SETTLE_LIMIT_S:
                return
            if claimed:
                # Rows were polled at this instant: the next tick comes one step on whatever is
                # due, so reading when the next row falls due would only cost a round trip.
                next_row: float | None = now + self.step_s
            else:
                due = operations_next_due_at(server_ids=self.server_ids)
                next_row = (due - self.clock.now()).total_seconds() + now if due is not None else None
            candidates = [c for c in (
                starts[cursor].start_s if cursor < len(starts) else None,
                actions[0][0] if actions else None,
                next_answer,
                next_row,
                next_sweep if open_rows else None,
            ) if c is not None]
            target = min(candidates) if candidates else now + SWEEP_S
            self.clock.set(max(target, now + self.step_s))

    def report_progress(self, *, settled: int) -> None:
        if self.on_progress is None or settled < self.next_progress:
            return
        self.next_progress = (settled // self.progress_every + 1) * self.progress_every
        self.on_progress(progress_snapshot(
            sims=self.sims, servers=self.servers, settled=settled, series=len(self.plans),
            polls=self.polls, virtual_seconds=round(self.clock.now_s(), 1)))

    # -- verdict -------------------------------------------------------------------------

    def verdict(self) -> tuple[dict[str, str], dict[str, int], dict[int, list[str]]]:
        truth: dict[str, str] = {}
        counts: dict[str, int] = {}
        for sim in self.sims:
            truth.update(sim.truth())
            counts.update(sim.created_per_key)
        rows = Operation.objects.filter(server__in=self.servers).values_list(
            "id", "submission_key", "state", "receipt__terminal_status")
        receipts = {key: (state, status) for _id, key, state, status in rows}
        failing: dict[int, list[str]] = {}
        for index, outcome in self.outcomes.items():
            problems = list(outcome.errors) + self.extra.problems(self.plans[index], outcome.keys)
            got = [receipts[k][1] for k in outcome.keys if k in receipts and receipts[k][1]]
            if len(got) > 1:
                problems.append(f"{len(got)} receipts for one call node")
            for key in outcome.keys:
                state, status = receipts.get(key, ("missing", None))
                want = truth.get(key)
                if counts.get(key, 0) > 1:
                    problems.append(f"server created {counts[key]} operations for key {key}")
                if want is not None and status != want:
                    problems.append(f"key {key}: receipt {status!r} ({state}) but the server says {want!r}")
                if want is None and status:
                    problems.append(f"key {key}: receipt {status!r} for a task the server never created")
            if not got:
                problems.append("no receipt for the call node")
            # Submit errors the services recovered from (the row went on to a correct receipt)
            # are not findings; anything else is.
            if got and all(p.startswith("submit:") for p in problems):
                problems = []
            if problems:
                failing[index] = problems + _trails(outcome.keys)
        return truth, counts, failing


# A failing series' report ends with the event kinds of each of its rows (repeats folded, the
# last ones kept): on CI, where the database is gone after the run, that is what there is to read.
TRAIL_EVENTS = 24


def _trails(keys: list[str]) -> list[str]:
    out = []
    for key in keys:
        kinds = list(OperationEvent.objects.filter(operation__submission_key=key)
                     .order_by("seq").values_list("kind", flat=True))
        folded: list[str] = []
        for kind, run in itertools.groupby(kinds):
            n = len(list(run))
            folded.append(kind if n == 1 else f"{kind}x{n}")
        out.append(f"events of {key}: {', '.join(folded[-TRAIL_EVENTS:])}")
    return out
