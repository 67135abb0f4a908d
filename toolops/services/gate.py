"""The release gate: eight figures over the ledger, each with its threshold.

One report for the real fleet and for the simulation (toolops/simulation/): both call
`gate_report`. The simulation can add what only a simulated server knows (its ground truth and
its own per-key operation counts) through the optional `ground_truth` and `peer_counts`
arguments; every other figure is read from the ledger the same way in both cases.

Read-only: this module writes nothing.

Figures and why each is computed the way it is:
- terminal_divergence: a receipt whose terminal status disagrees with the last terminal status
  the server reported in the operation's own event series (before acceptance). A confirmed cancel
  (receipt `cancelled`, accepted from CANCEL_REQUESTED) is its own truth: the server said the
  cancel was accepted, and a late completion afterwards is an effect reconciliation, not a
  divergence. With `ground_truth` (submission key -> expected status) every receipt is compared
  with it instead, and a key with a truth but no receipt at the end counts as unsettled.
- duplicate_operations: remote operations that share a (server, remote id) across two ledger rows,
  plus call nodes with more than one attempt that reached a server; with `peer_counts` also every
  submission key the server created more than once.
- poll_rate: the QPS bucket's own peak grants in one (wall or virtual) second over the configured
  cap (toolops/services/poll_report.py), the worst server.
- cancel_confirmation_p99: `cancel_confirmation_ms` in `accepted` events (written by acceptance:
  cancel request to accepted terminal, whichever way the cancel ended), nearest-rank p99. Rows an
  operator settled from the queue (`settled_by: operator`, an attested result) are counted apart.
- unknown_resolution: the longest time any operation spent in SUBMISSION_UNKNOWN (closed spells and
  open ones up to now), against the 15-minute deadline to resolve it or queue it for an operator.
- outbox_traceable: share of outbox rows whose receipt names an operation and agrees with it (the
  payload's receipt and operation ids, call node, epoch and status).
- stranded_open_rows: open rows in none of the four places an open row may be: due or leased (a
  polled state with `next_poll_at` or a lease; an expired lease is re-claimed), waiting on an
  input round (INPUT_REQUIRED with a round open, or answered and not yet delivered), or queued (an
  open reconciliation item). Such a row would never move again; the constraint
  op_open_row_scheduled rules out the first kind, this figure sees the rest.
- oldest_overdue_row_s: how long the most overdue due row has waited past the time it became
  claimable (its next poll time, or its lease's end when that is later). A fleet claims every
  second, so this stays near zero while anything is claiming; a row overdue by more than the
  threshold means nobody is (no dispatcher, or a claim query that skips it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count, Exists, OuterRef, Q
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from ledger.models import (
    Operation,
    OperationDue,
    OperationEvent,
    OutboxEvent,
    ReconciliationItem,
    TerminalReceipt,
)
from ledger.selectors.inputs import input_rounds_waiting
from ledger.states import OPEN, State, TerminalStatus
from toolops.services.dispatch import CLAIMABLE
from toolops.services.poll_report import poll_report_servers

# The release thresholds: what must hold before a build ships (README, the gate).
DIVERGENCE_MAX = 0
DUPLICATES_MAX = 0
# Peak requests in one second over the configured QPS: at most the cap itself.
POLL_RATE_MAX = 1.0
# A cancel must be confirmed (or lose to a terminal state) within a minute at p99.
CANCEL_P99_MAX_MS = 60_000.0
# Every SUBMISSION_UNKNOWN is resolved or queued for an operator within 15 minutes.
UNKNOWN_MAX_SECONDS = 15 * 60.0
OUTBOX_TRACEABLE_MIN = 1.0
# No open row outside due / leased / waiting on input / queued.
STRANDED_MAX = 0
# Longest wait past claimability: the lease (30 s by default) plus the backoff cap (60 s) plus
# the dispatcher's one-second tick is about 90 s in the worst healthy case; five minutes leaves a
# wide margin for a loaded fleet and still pages well before a wait budget runs out.
OVERDUE_MAX_SECONDS = 300.0

TERMINAL = frozenset(s.value for s in TerminalStatus)


@dataclass(frozen=True)
class GateFigure:
    name: str
    value: float | None
    threshold: float
    comparison: str  # "<=", "<" or ">="
    passed: bool
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GateReport:
    figures: tuple[GateFigure, ...]
    generated_at: str

    @property
    def passed(self) -> bool:
        return all(f.passed for f in self.figures)

    def figure(self, name: str) -> GateFigure:
        return next(f for f in self.figures if f.name == name)

    def as_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "generated_at": self.generated_at,
                "figures": [asdict(f) for f in self.figures]}


def _figure(*, name: str, value: float | None, threshold: float, comparison: str,
            detail: dict[str, Any]) -> GateFigure:
    if value is None:  # nothing to measure (no cancels, no UNKNOWN): nothing failed
        passed = True
    elif comparison == "<=":
        passed = value <= threshold
    elif comparison == "<":
        passed = value < threshold
    else:
        passed = value >= threshold
    return GateFigure(name=name, value=value, threshold=threshold, comparison=comparison,
                      passed=passed, detail=detail)


def _sample(items: Iterable[Any], limit: int = 10) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if len(out) >= limit:
            break
        out.append(item)
    return out


def _operations(*, since: datetime | None, server_names: list[str] | None) -> Any:
    ops = Operation.objects.filter(shadow=False)
    if since is not None:
        ops = ops.filter(created_at__gte=since)
    if server_names:
        ops = ops.filter(server__name__in=server_names)
    return ops


def _divergence(*, ops: Any, ground_truth: Mapping[str, str] | None) -> GateFigure:
    receipts = TerminalReceipt.objects.filter(operation__in=ops).values_list(
        "operation_id", "operation__submission_key", "terminal_status", "operation__state")
    diverged: list[dict[str, Any]] = []
    if ground_truth is not None:
        seen = set()
        for op_id, key, status, _state in receipts.iterator(chunk_size=2000):
            seen.add(key)
            truth = ground_truth.get(key)
            if truth != status:
                diverged.append({"operation_id": str(op_id), "submission_key": key,
                                 "receipt": status, "truth": truth})
        unsettled = sorted(k for k, v in ground_truth.items() if v in TERMINAL and k not in seen)
        detail: dict[str, Any] = {"source": "ground_truth", "receipts": len(seen),
                                  "unsettled": len(unsettled), "unsettled_sample": unsettled[:10]}
        value = len(diverged) + len(unsettled)
    else:
        # Last terminal status the server (or an operator, with evidence) reported per operation,
        # seen before (or with) the accepted event. Where it comes from:
        # - an event whose row server_state is terminal (terminal_observed, cancel_confirmed, ...);
        # - `sync_result`: a synchronous reply carries its outcome (an error reply = failed);
        # - `reconciliation_resolved` with a terminal_status: an operator accepted what they saw.
        # A result refused by output defense (`output_rejected`) is a local verdict over the
        # server's, by policy: counted apart, not as divergence.
        accepted_seq = dict(OperationEvent.objects.filter(operation__in=ops, kind="accepted")
                            .values_list("operation_id", "seq"))
        last_seen: dict[Any, tuple[int, str]] = {}
        rejected: set[Any] = set()
        observed = OperationEvent.objects.filter(operation__in=ops).filter(
            Q(server_state__in=TERMINAL) | Q(kind__in=("sync_result", "reconciliation_resolved",
                                                       "output_rejected"))
        ).values_list("operation_id", "seq", "kind", "server_state", "data")
        for op_id, seq, kind, server_state, data in observed.iterator(chunk_size=5000):
            limit = accepted_seq.get(op_id)
            if limit is not None and seq > limit:
                continue  # after acceptance: a late effect, recorded separately
            if kind == "output_rejected":
                rejected.add(op_id)
                continue
            if kind == "sync_result":
                status = "failed" if (data or {}).get("kind") == "error" else "completed"
            elif kind == "reconciliation_resolved" and (data or {}).get("terminal_status") in TERMINAL:
                status = data["terminal_status"]
            elif server_state in TERMINAL:
                status = server_state
            else:
                continue
            if op_id not in last_seen or seq > last_seen[op_id][0]:
                last_seen[op_id] = (seq, status)
        confirmed_cancels = output_rejected = 0
        for op_id, key, status, state in receipts.iterator(chunk_size=2000):
            if status == TerminalStatus.CANCELLED and state == State.CANCELLED_ACCEPTED:
                confirmed_cancels += 1
                continue
            seen_status = last_seen.get(op_id, (0, None))[1]
            if seen_status != status and op_id in rejected:
                output_rejected += 1
                continue
            if seen_status != status:
                diverged.append({"operation_id": str(op_id), "submission_key": key,
                                 "receipt": status, "last_server_status": seen_status})
        detail = {"source": "ledger_events", "confirmed_cancels_exempt": confirmed_cancels,
                  "output_rejected_exempt": output_rejected}
        value = len(diverged)
    detail["diverged"] = len(diverged)
    detail["sample"] = diverged[:10]
    return _figure(name="terminal_divergence", value=value, threshold=DIVERGENCE_MAX,
                   comparison="<=", detail=detail)


def _duplicates(*, ops: Any, peer_counts: Mapping[str, int] | None) -> GateFigure:
    shared = list(ops.exclude(remote_id="").values("server_id", "remote_id")
                  .annotate(n=Count("id")).filter(n__gt=1).values_list("server_id", "remote_id", "n"))
    # Two attempts of one call node that both reached a server: only NOT_FOUND_SAFE frees a call
    # node, and it means "never created", so a NOT_FOUND_SAFE row with a remote id plus a live one
    # is a second remote operation.
    nodes = list(ops.exclude(remote_id="").values("tenant", "call_node_id")
                 .annotate(n=Count("id")).filter(n__gt=1).values_list("tenant", "call_node_id", "n"))
    peer_dupes = sorted((k, n) for k, n in (peer_counts or {}).items() if n > 1)
    value = len(shared) + len(nodes) + len(peer_dupes)
    detail: dict[str, Any] = {
        "shared_remote_ids": len(shared), "call_nodes_with_two_remote_attempts": len(nodes),
        "sample": [list(x) for x in _sample(shared)] + [list(x) for x in _sample(nodes)],
    }
    if peer_counts is not None:
        detail.update(source="ledger+server_counts", server_keys=len(peer_counts),
                      server_duplicate_keys=len(peer_dupes), server_sample=peer_dupes[:10])
    return _figure(name="duplicate_operations", value=value, threshold=DUPLICATES_MAX,
                   comparison="<=", detail=detail)


def _poll_rate(*, server_names: list[str] | None) -> GateFigure:
    rows = [f for f in poll_report_servers(names=server_names) if f.total_requests]
    worst = max(rows, key=lambda f: f.peak_over_configured, default=None)
    detail = {"servers": len(rows), "backend": rows[0].backend if rows else "",
              "worst": None if worst is None else {
                  "server": worst.server, "configured_qps": worst.configured_qps,
                  "peak_requests_in_one_second": worst.peak_requests_in_one_second,
                  "total_requests": worst.total_requests}}
    return _figure(name="poll_rate_over_qps", value=None if worst is None else worst.peak_over_configured,
                   threshold=POLL_RATE_MAX, comparison="<=", detail=detail)


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile (no interpolation: the figure is a value that really happened)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(pct / 100 * len(ordered)) - 1, 0)]


def _cancel_p99(*, ops: Any) -> GateFigure:
    data: list[dict[str, Any]] = list(OperationEvent.objects.filter(
        operation__in=ops, kind="accepted", data__has_key="cancel_confirmation_ms",
    ).values_list("data", flat=True))
    # A row the server never confirmed (its task was lost or expired) and an operator settled from
    # the queue measures the operator, not the protocol: listed apart, never hidden.
    by_operator = [float(d["cancel_confirmation_ms"]) for d in data if d.get("settled_by") == "operator"]
    data = [d for d in data if d.get("settled_by") != "operator"]
    values = [float(d["cancel_confirmation_ms"]) for d in data]
    won = sum(1 for d in data if d.get("cancel_outcome") == "won")
    p99 = percentile(values, 99)
    return _figure(name="cancel_confirmation_p99_ms", value=p99, threshold=CANCEL_P99_MAX_MS,
                   comparison="<", detail={"cancels": len(values), "won": won,
                                           "max_ms": max(values) if values else None,
                                           "p50_ms": percentile(values, 50),
                                           "settled_by_operator": len(by_operator),
                                           "settled_by_operator_max_ms": max(by_operator, default=None)})


def _unknown(*, ops: Any, now: datetime) -> GateFigure:
    """Spells in SUBMISSION_UNKNOWN from the event series: entered by an event whose to_state is
    it, closed by the next event that leaves it (to any other state, the queue included)."""
    events = OperationEvent.objects.filter(
        operation__in=ops).filter(Q(to_state=State.SUBMISSION_UNKNOWN) | Q(
            from_state=State.SUBMISSION_UNKNOWN)).order_by("operation_id", "seq").values_list(
        "operation_id", "from_state", "to_state", "created_at")
    entered: dict[Any, datetime] = {}
    longest = 0.0
    longest_op = None
    spells = open_now = 0
    for op_id, src, dst, at in events.iterator(chunk_size=5000):
        if dst == State.SUBMISSION_UNKNOWN and src != State.SUBMISSION_UNKNOWN:
            entered.setdefault(op_id, at)
        elif src == State.SUBMISSION_UNKNOWN and dst and dst != State.SUBMISSION_UNKNOWN:
            start = entered.pop(op_id, None)
            if start is not None:
                spells += 1
                if (at - start).total_seconds() > longest:
                    longest, longest_op = (at - start).total_seconds(), op_id
    for op_id, start in entered.items():
        spells += 1
        open_now += 1
        if (now - start).total_seconds() > longest:
            longest, longest_op = (now - start).total_seconds(), op_id
    return _figure(name="unknown_resolved_or_queued_s", value=longest if spells else None,
                   threshold=UNKNOWN_MAX_SECONDS, comparison="<=",
                   detail={"spells": spells, "still_unknown": open_now,
                           "longest_operation_id": str(longest_op) if longest_op else None})


def _outbox(*, ops: Any) -> GateFigure:
    rows = OutboxEvent.objects.filter(receipt__operation__in=ops).values_list(
        "id", "payload", "receipt_id", "receipt__operation_id", "receipt__call_node_id",
        "receipt__execution_epoch", "receipt__terminal_status", "receipt__operation__call_node_id")
    total = 0
    bad: list[int] = []
    for oid, payload, rid, op_id, node, epoch, status, op_node in rows.iterator(chunk_size=5000):
        total += 1
        if not (op_id and node == op_node and payload.get("receipt_id") == rid
                and payload.get("operation_id") == str(op_id) and payload.get("call_node_id") == node
                and payload.get("execution_epoch") == epoch and payload.get("terminal_status") == status):
            bad.append(oid)
    # Rows outside the scope filter are counted too when no filter is given (an orphan cannot be
    # scoped by operation, so only the unfiltered report sees it).
    value = None if total == 0 else round((total - len(bad)) / total, 6)
    return _figure(name="outbox_traceable_share", value=value, threshold=OUTBOX_TRACEABLE_MIN,
                   comparison=">=", detail={"outbox_rows": total, "untraceable": len(bad),
                                            "sample": bad[:10]})


def _stranded(*, ops: Any) -> GateFigure:
    # Scheduled means the claim can find it: a due entry (kept by the database's triggers, so a
    # row without one is stranded however its own times read).
    scheduled = Q(state__in=CLAIMABLE) & Exists(
        OperationDue.objects.filter(operation=OuterRef("pk")))
    waiting = Exists(input_rounds_waiting().filter(operation=OuterRef("pk")))
    queued = Exists(ReconciliationItem.objects.filter(operation=OuterRef("pk"),
                                                      status=ReconciliationItem.Status.OPEN))
    rows = (ops.filter(state__in=[s.value for s in OPEN]).exclude(scheduled)
            .annotate(waiting=waiting, queued=queued).filter(queued=False)
            .exclude(state=State.INPUT_REQUIRED, waiting=True))
    sample = [{"operation_id": str(r["id"]), "state": r["state"],
               "updated_at": r["updated_at"].isoformat()}
              for r in rows.order_by("updated_at").values("id", "state", "updated_at")[:10]]
    count = rows.count()
    return _figure(name="stranded_open_rows", value=count, threshold=STRANDED_MAX,
                   comparison="<=", detail={"stranded": count, "sample": sample})


def _overdue(*, ops: Any, now: datetime) -> GateFigure:
    claimable_at = Greatest(Coalesce("next_poll_at", "lease_expires_at"),
                            Coalesce("lease_expires_at", "next_poll_at"))
    oldest = (ops.filter(state__in=CLAIMABLE)
              .filter(Q(next_poll_at__isnull=False) | Q(lease_expires_at__isnull=False))
              .annotate(claimable_at=claimable_at).order_by("claimable_at")
              .values("id", "state", "next_poll_at", "lease_expires_at", "claimable_at").first())
    if oldest is None:
        return _figure(name="oldest_overdue_row_s", value=None, threshold=OVERDUE_MAX_SECONDS,
                       comparison="<=", detail={"scheduled_rows": 0})
    age = max((now - oldest["claimable_at"]).total_seconds(), 0.0)
    return _figure(name="oldest_overdue_row_s", value=round(age, 3), threshold=OVERDUE_MAX_SECONDS,
                   comparison="<=", detail={
                       "operation_id": str(oldest["id"]), "state": oldest["state"],
                       "next_poll_at": oldest["next_poll_at"], "lease_expires_at":
                       oldest["lease_expires_at"]})


def gate_report(*, since: datetime | None = None, server_names: list[str] | None = None,
                ground_truth: Mapping[str, str] | None = None,
                peer_counts: Mapping[str, int] | None = None,
                now: datetime | None = None) -> GateReport:
    """The eight gate figures over the ledger (optionally one window / some servers)."""
    now = now or timezone.now()
    ops = _operations(since=since, server_names=server_names)
    figures = (
        _divergence(ops=ops, ground_truth=ground_truth),
        _duplicates(ops=ops, peer_counts=peer_counts),
        _poll_rate(server_names=server_names),
        _cancel_p99(ops=ops),
        _unknown(ops=ops, now=now),
        _outbox(ops=ops),
        _stranded(ops=ops),
        _overdue(ops=ops, now=now),
    )
    return GateReport(figures=figures, generated_at=now.isoformat())
