"""Prometheus metrics, correct under any number of worker processes.

Two sources, chosen per metric for exactness:

- Ledger-derived (a custom collector queried at scrape time): operations by state, transitions,
  poll requests by server and outcome, acceptance and cancel-confirmation latency, open
  reconciliation items and their age, outbox backlog. The ledger is shared by every process, so
  these figures are exact whichever process (web, Celery worker, embedded runner) did the work, and
  they survive restarts. Poll requests are counted from the events each poll writes (one event per
  answered or failed request), never from an in-memory counter.
- Process counters (prometheus_client multiprocess mode when PROMETHEUS_MULTIPROC_DIR is set):
  events with no ledger trace of their own (QPS tokens denied, API submissions, outbox deliveries,
  output rejections). Every process writes its own mmap file in that directory and the scrape sums
  them. Without the directory (a single process) the default registry is used.

Server names are labels only where the scraper may see them (TOOLOPS_METRICS_SERVER_LABELS):
"shared" (default) names servers shared by every tenant and folds each organisation's own
servers into `server="tenant"`; "all" names every server; "none" folds every server into
`server="all"`. The endpoint itself needs a bearer token (toolops/metrics_view.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db.models import Count, F, Min, Q, Sum
from django.utils import timezone
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from ledger.models import (
    Operation,
    OperationEvent,
    OutboxEvent,
    ReconciliationItem,
    TerminalReceipt,
    ToolServer,
)
from ledger.states import State

# Latency buckets (seconds) from a quick sync call to a long-running task's multi-hour budget.
LATENCY_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0)

# Event kinds written once per poll request, and the outcome each one means. A poll answered
# with a non-terminal status is counted on its row (`Operation.polls_count`), not as an event.
POLL_EVENT_OUTCOMES = {
    "terminal_observed": "terminal",
    "poll_error": "error",
}

QPS_TOKENS_DENIED = Counter("toolops_qps_tokens_denied_total",
                            "Requests held back because a server's QPS budget was spent", ["server"])
API_SUBMISSIONS = Counter("toolops_api_submissions_total",
                          "Submissions through the REST API by outcome", ["outcome"])
OUTBOX_DELIVERIES = Counter("toolops_outbox_deliveries_total",
                            "Outbox handler calls by outcome", ["outcome"])
OUTPUT_REJECTED = Counter("toolops_output_rejected_total",
                          "Results rejected by the tool output defense", ["server", "policy"])


# The adaptive gate's limit (toolops/services/poll_concurrency.py), summed over the live worker
# processes writing to this metrics directory: how many polls they let run at once. Low while
# the machine is saturated (polls then come later than due), up to the poll threads otherwise.
POLL_CONCURRENCY = Gauge("toolops_poll_concurrency_limit",
                         "Polls the worker processes let run at once (adaptive gate), summed",
                         multiprocess_mode="livesum")


def qps_token_denied_inc(*, server: str) -> None:
    QPS_TOKENS_DENIED.labels(server=server).inc()


def api_submission_inc(*, outcome: str) -> None:
    API_SUBMISSIONS.labels(outcome=outcome).inc()


def outbox_delivery_inc(*, outcome: str) -> None:
    OUTBOX_DELIVERIES.labels(outcome=outcome).inc()


def output_rejected_inc(*, server: str, policy: str) -> None:
    OUTPUT_REJECTED.labels(server=server, policy=policy).inc()


def poll_concurrency_set(*, limit: int) -> None:
    POLL_CONCURRENCY.set(limit)


def poll_concurrency_gone() -> None:
    """This process stops polling: its limit leaves the sum. A process killed before it gets
    here leaves its last value in the metrics directory until the directory is emptied (as
    prometheus_client asks of every deployment at start)."""
    POLL_CONCURRENCY.set(0)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        mark_process_dead(os.getpid())


def _histogram(name: str, doc: str, seconds: list[float]) -> HistogramMetricFamily:
    buckets = []
    for bound in LATENCY_BUCKETS:
        buckets.append((str(bound), float(sum(1 for s in seconds if s <= bound))))
    buckets.append(("+Inf", float(len(seconds))))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=float(sum(seconds)))


class LedgerCollector(Collector):
    """Reads the ledger at scrape time. Each family is one aggregate query (two for latencies)."""

    def collect(self) -> Iterator[Any]:
        yield from self._operations()
        yield from self._transitions_and_polls()
        yield from self._latencies()
        yield from self._reconciliation()
        yield from self._outbox()

    def _operations(self) -> Iterator[Any]:
        g = GaugeMetricFamily("toolops_operations", "Operations by local state", labels=["state"])
        counts = dict(Operation.objects.values_list("state").annotate(n=Count("id")).order_by())
        for state in State:
            g.add_metric([state.value], float(counts.get(state.value, 0)))
        yield g

    def _transitions_and_polls(self) -> Iterator[Any]:
        t = CounterMetricFamily("toolops_transitions", "State transitions recorded in the ledger",
                                labels=["from_state", "to_state"])
        rows = (OperationEvent.objects.exclude(to_state="").exclude(from_state=F("to_state"))
                .values_list("from_state", "to_state").annotate(n=Count("id")).order_by())
        for src, dst, n in rows:
            t.add_metric([src, dst], float(n))
        yield t
        p = CounterMetricFamily("toolops_poll_requests", "Poll requests by server and outcome",
                                labels=["server", "outcome"])
        polls = (OperationEvent.objects.filter(kind__in=POLL_EVENT_OUTCOMES)
                 .values_list("operation__server__name", "kind").annotate(n=Count("id")).order_by())
        not_found = (OperationEvent.objects
                     .filter(kind="reconciliation_required", data__reason="not_found_unknown")
                     .values_list("operation__server__name").annotate(n=Count("id")).order_by())
        for server, kind, n in polls:
            p.add_metric([server, POLL_EVENT_OUTCOMES[kind]], float(n))
        working = (Operation.objects.filter(polls_count__gt=0).values_list("server__name")
                   .annotate(n=Sum("polls_count")).order_by())
        for server, n in working:
            p.add_metric([server, "ok"], float(n))
        for server, n in not_found:
            p.add_metric([server, "not_found"], float(n))
        yield p

    def _latencies(self) -> Iterator[Any]:
        accepted = [
            (acc - created).total_seconds()
            for created, acc in TerminalReceipt.objects.values_list("operation__created_at", "accepted_at")
        ]
        yield _histogram("toolops_acceptance_latency_seconds",
                         "Submission to accepted terminal receipt", accepted)
        # Cancel confirmation: first CANCEL_REQUESTED event to the cancelled receipt.
        requested = dict(
            OperationEvent.objects.filter(to_state=State.CANCEL_REQUESTED)
            .values_list("operation_id").annotate(at=Min("created_at")).order_by()
        )
        confirmed = [
            (acc - requested[op_id]).total_seconds()
            for op_id, acc in TerminalReceipt.objects.filter(terminal_status="cancelled")
            .values_list("operation_id", "accepted_at")
            if op_id in requested
        ]
        yield _histogram("toolops_cancel_confirmation_latency_seconds",
                         "Cancel requested to cancelled receipt", confirmed)

    def _reconciliation(self) -> Iterator[Any]:
        now = timezone.now()
        items = ReconciliationItem.objects.filter(status=ReconciliationItem.Status.OPEN)
        agg = items.aggregate(n=Count("id"), oldest=Min("created_at"))
        yield GaugeMetricFamily("toolops_reconciliation_open_items", "Open reconciliation items",
                                value=float(agg["n"]))
        oldest = agg["oldest"]
        yield GaugeMetricFamily("toolops_reconciliation_oldest_open_age_seconds",
                                "Age of the oldest open reconciliation item (0 when none)",
                                value=(now - oldest).total_seconds() if oldest else 0.0)
        # Rows in RECONCILIATION_REQUIRED whether or not an item row was opened for them.
        ops = Operation.objects.filter(state=State.RECONCILIATION_REQUIRED).aggregate(
            n=Count("id"), oldest=Min("updated_at"))
        yield GaugeMetricFamily("toolops_operations_reconciliation_required_oldest_age_seconds",
                                "Age since the last change of the oldest operation awaiting reconciliation",
                                value=(now - ops["oldest"]).total_seconds() if ops["oldest"] else 0.0)

    def _outbox(self) -> Iterator[Any]:
        agg = OutboxEvent.objects.aggregate(
            unpublished=Count("id", filter=Q(published_at__isnull=True)),
            traceable=Count("id", filter=Q(receipt__operation__isnull=False)), total=Count("id"))
        yield GaugeMetricFamily("toolops_outbox_unpublished", "Outbox events not yet delivered",
                                value=float(agg["unpublished"]))
        yield GaugeMetricFamily("toolops_outbox_traceable_ratio",
                                "Share of outbox events whose receipt names an operation (1 when empty)",
                                value=agg["traceable"] / agg["total"] if agg["total"] else 1.0)


SERVER_LABEL_MODES = frozenset({"shared", "all", "none"})


def server_label_map() -> dict[str, str]:
    """Server name -> the label value a scrape may show for it (see the module doc)."""
    mode = str(settings.TOOLOPS_METRICS_SERVER_LABELS)
    if mode not in SERVER_LABEL_MODES:
        raise RuntimeError(f"TOOLOPS_METRICS_SERVER_LABELS must be one of {sorted(SERVER_LABEL_MODES)}")
    rows = ToolServer.objects.values_list("name", "tenant")
    if mode == "all":
        return {name: name for name, _ in rows}
    if mode == "none":
        return {name: "all" for name, _ in rows}
    return {name: (name if not tenant else "tenant") for name, tenant in rows}


class _ServerRelabel(Collector):
    """Rewrites every `server` label through `server_label_map`, summing samples that then meet."""

    def __init__(self, inner: Collector) -> None:
        self._inner = inner

    def collect(self) -> Iterator[Any]:
        labels = server_label_map()
        for family in self._inner.collect():
            if not any("server" in s.labels for s in family.samples):
                yield family
                continue
            out = Metric(family.name, family.documentation, family.type, family.unit)
            sums: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
            for s in family.samples:
                relabelled = dict(s.labels)
                if "server" in relabelled:
                    # An unknown name (a deleted server) is never shown as itself either.
                    relabelled["server"] = labels.get(relabelled["server"], "unknown")
                key = (s.name, tuple(sorted(relabelled.items())))
                sums[key] = sums.get(key, 0.0) + s.value
            for (name, pairs), value in sums.items():
                out.add_sample(name, dict(pairs), value)
            yield out


def metrics_registry() -> CollectorRegistry:
    """A registry for one scrape: multiprocess counters (or this process's) plus the ledger."""
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry.register(_ServerRelabel(MultiProcessCollector(None)))
    else:
        # Single process: this process's counters (not the default process/platform collectors).
        for metric in (QPS_TOKENS_DENIED, API_SUBMISSIONS, OUTBOX_DELIVERIES, OUTPUT_REJECTED,
                       POLL_CONCURRENCY):
            registry.register(_ServerRelabel(_Forward(metric)))
    registry.register(_ServerRelabel(LedgerCollector()))
    return registry


class _Forward(Collector):
    def __init__(self, metric: Counter | Gauge) -> None:
        self._metric = metric

    def collect(self) -> Iterator[Any]:
        yield from self._metric.collect()


def metrics_render() -> tuple[bytes, str]:
    return generate_latest(metrics_registry()), CONTENT_TYPE_LATEST
