"""The per-server cap counts HTTP requests, not adapter calls (toolops/services/connections.py).

One adapter call can send several requests: a submission-key lookup against a cooperating server
posts to the server's key endpoint and then reads the task with `tasks/get`. Every request must
spend its own token. These tests talk HTTP to the reference SDK server through a recording
transport, and compare what the bucket granted with what actually went over the wire.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from adapters import adapter_for
from ledger.models import Operation, OperationEvent, ToolServer
from ledger.states import State
from tests.peers.fault_transport import DropToolsCall
from tests.peers.launch import peer_stats, running_reference_server
from toolops.qps import qps_bucket, server_bucket_key
from toolops.runner import run_embedded
from toolops.services import connections
from toolops.services.connections import RateLimited, server_call
from toolops.services.servers import server_add
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db

# Low enough that two unpaced requests would be visibly closer than one token interval.
RATE = 2.0
# Send times are taken at the transport, after the grant: allow scheduling noise below 1/RATE.
MIN_GAP_S = 0.8 / RATE


class RecordingTransport(httpx.BaseTransport):
    """Records each request (label, send time), then hands it to `inner` (the real server, or a
    fault proxy in front of it)."""

    def __init__(self, inner: httpx.BaseTransport | None = None) -> None:
        self.inner = inner or httpx.HTTPTransport()
        self.sent: list[tuple[str, float]] = []
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        label = request.url.path
        if body[:1] == b"{":
            parsed: Any = json.loads(body)
            if isinstance(parsed, dict) and isinstance(parsed.get("method"), str):
                label = parsed["method"]
        with self._lock:
            self.sent.append((label, time.monotonic()))
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module")
def coop_url() -> Iterator[str]:
    with running_reference_server(cooperating="full", poll_interval_ms=100) as url:
        yield url


def _route(monkeypatch: pytest.MonkeyPatch, transport: RecordingTransport) -> None:
    def recorded(**kwargs: Any) -> Any:
        return adapter_for(**{**kwargs, "transport": transport})

    monkeypatch.setattr(connections, "adapter_for", recorded)
    connections.adapters_close_all()


def _server(url: str, *, rate: float) -> ToolServer:
    server = server_add(name=f"gate-{uuid.uuid4().hex[:6]}", url=url, max_qps=rate)
    qps_bucket().reset(key=server_bucket_key(server_id=server.pk))
    return server


def test_a_key_lookup_spends_one_token_per_request(
    coop_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = RecordingTransport(DropToolsCall(forward=True))  # the create's answer is lost
    _route(monkeypatch, transport)
    server = _server(coop_url, rate=RATE)
    before = peer_stats(coop_url)["tasks_created"]
    op = operation_submit(server_name=server.name, tool_name="sleep_then_complete",
                          call_node_id="n-lookup-gate", arguments={"seconds": 0.2, "value": "v"},
                          ttl_ms=60_000)
    assert op.state == State.SUBMISSION_UNKNOWN
    run_embedded(until_idle=True, max_seconds=30)
    op.refresh_from_db()
    assert op.state == State.ACCEPTED
    resolved = OperationEvent.objects.get(operation=op, kind="submission_resolved")
    assert resolved.data["how"] == "key_lookup"
    assert peer_stats(coop_url)["tasks_created"] - before == 1

    labels = [label for label, _ in transport.sent]
    lookups = labels.count("/_peer/keys")
    assert lookups >= 1, labels
    # The key endpoint is followed by tasks/get inside the same adapter call: two requests.
    stats = qps_bucket().stats(key=server_bucket_key(server_id=server.pk))
    assert stats.by_purpose["lookup"] == 2 * lookups
    # Every request on the wire was paid for, and none was paid for twice.
    assert stats.total == len(transport.sent), (stats, labels)
    # A capacity-1 bucket at RATE spaces consecutive requests by at least 1/RATE.
    times = [t for _, t in transport.sent]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= MIN_GAP_S, list(zip(labels[1:], gaps, strict=True))
    assert stats.peak_in_one_second <= RATE


def test_a_second_request_without_a_token_is_refused_and_not_sent(
    mcp_url: str, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    transport = RecordingTransport()
    _route(monkeypatch, transport)
    # The submit is only the setup (it may need a session first: two requests), so it runs under
    # an ordinary cap; then the cap drops to one token per 5 s, which the follow-up cannot wait for.
    server = _server(mcp_url, rate=RATE)
    op = operation_submit(server_name=server.name, tool_name="sleep_then_complete",
                          call_node_id="n-second-request", arguments={"seconds": 30, "value": "v"},
                          ttl_ms=60_000)
    assert op.state == State.WORKING
    ToolServer.objects.filter(pk=server.pk).update(max_qps=0.2)
    server.refresh_from_db()
    qps_bucket().reset(key=server_bucket_key(server_id=server.pk))
    sent_before = len(transport.sent)

    def two_reads(adapter: Any) -> None:
        adapter.get(remote_id=op.remote_id)
        adapter.get(remote_id=op.remote_id)

    with pytest.raises(RateLimited) as refused:
        server_call(server=server, purpose="poll", fn=two_reads)
    assert refused.value.purpose == "poll"
    # The first request went out on the call's token; the second was refused before sending.
    assert [label for label, _ in transport.sent[sent_before:]] == ["tasks/get"]
    stats = qps_bucket().stats(key=server_bucket_key(server_id=server.pk))
    assert stats.by_purpose == {"poll": 1}
    assert Operation.objects.get(id=op.id).state == State.WORKING
