"""Per-server poll figures: the configured cap against what was really sent.

Read-only; `toolops polls` prints it today and `toolops gate` can reuse `poll_report_servers`.
Request counts come from the QPS bucket's own counters (counted by the script that grants the
token, so every request sent is counted once and nothing else is; a grant abandoned past its
send deadline is taken back out of the totals). The peak is of grants per calendar second at the
bucket, not of arrivals at the server: benchmarks/qps_wire.py measures those (docs/conformance.md,
"The cap at the wire"). Negotiation at `server-add` is counted on the URL's own bucket, not here.
Operation counts come from the ledger. The bucket counters live as long as their Redis keys (or
the embedded process), so `polls_per_operation` is meaningful for a run that started from `poll_report_reset`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from django.db.models import Count, Q

from ledger.models import ToolServer
from ledger.states import State
from toolops.qps import qps_backend_name, qps_bucket, server_bucket_key


@dataclass(frozen=True)
class ServerPollFigures:
    server: str
    configured_qps: float
    peak_requests_in_one_second: int
    peak_over_configured: float
    total_requests: int
    refused_tokens: int
    # Grants given up unused past their send deadline (toolops/qps.py); not in total_requests.
    abandoned_grants: int = 0
    # Grants worker processes took ahead of their requests and have not reported yet (sent or
    # unused; toolops/qps_redis.py): in the peak already, in the totals once reported.
    prefetched_grants: int = 0
    requests_by_purpose: dict[str, int] = field(default_factory=dict)
    operations: int = 0
    operations_accepted: int = 0
    polls_per_operation: float | None = None
    backend: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def poll_report_servers(*, names: list[str] | None = None) -> list[ServerPollFigures]:
    servers = ToolServer.objects.order_by("name")
    if names:
        servers = servers.filter(name__in=names)
    servers = servers.annotate(
        # Rows that reached the server (a remote id): the ones that can be polled at all.
        ops=Count("operations", filter=~Q(operations__remote_id="")),
        accepted=Count("operations", filter=Q(operations__state=State.ACCEPTED)),
    )
    bucket = qps_bucket()
    backend = qps_backend_name()
    figures = []
    for server in servers:
        stats = bucket.stats(key=server_bucket_key(server_id=server.pk))
        polls = stats.by_purpose.get("poll", 0)
        figures.append(ServerPollFigures(
            server=server.name,
            configured_qps=server.max_qps,
            peak_requests_in_one_second=stats.peak_in_one_second,
            peak_over_configured=round(stats.peak_in_one_second / server.max_qps, 4),
            total_requests=stats.total,
            refused_tokens=stats.denied,
            abandoned_grants=stats.abandoned,
            prefetched_grants=stats.prefetched,
            requests_by_purpose=dict(sorted(stats.by_purpose.items())),
            operations=server.ops,  # type: ignore[attr-defined]
            operations_accepted=server.accepted,  # type: ignore[attr-defined]
            polls_per_operation=round(polls / server.ops, 3) if server.ops else None,  # type: ignore[attr-defined]
            backend=backend,
        ))
    return figures


def poll_report_reset(*, server_id: int) -> None:
    """Start a server's request counters (and its bucket) afresh, e.g. before a measured run."""
    qps_bucket().reset(key=server_bucket_key(server_id=server_id))
