"""The cap at the wire: spacing for arrivals, the send deadline, negotiation under the cap.

Measured against a real server's door by benchmarks/qps_wire.py; these tests check the rules
themselves against the official SDK server over real HTTP, counting what it received.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator

import pytest
from django.test import override_settings

from tests.peers.fault_transport import FaultTransport
from toolops.qps import (
    LocalTokenBucket,
    door_bucket_key,
    qps_bucket,
    qps_bucket_replace,
    server_bucket_key,
    wire_allowance_seconds,
    wire_rate,
)
from toolops.services.connections import server_call
from toolops.services.servers import server_add

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("cap", [0.5, 1.0, 2.5, 3.0, 20.0, 200.0])
def test_spacing_keeps_any_cap_plus_one_arrivals_over_a_second_apart(cap: float) -> None:
    """n + 1 grants span n intervals; each arrival lags its grant by at most the allowance, so
    the arrivals of n + 1 grants span at least n * interval - allowance, which must exceed 1 s."""
    n = max(1, math.floor(cap))
    interval = 1.0 / wire_rate(cap=cap)
    assert interval >= 1.0 / cap  # never faster than the cap itself
    assert n * interval - wire_allowance_seconds() >= 1.0 - 1e-9
    # ... and no slower than the cap's own figure plus the allowance asks for.
    assert interval <= max(1.0 / cap, (1.0 + wire_allowance_seconds()) / n) + 1e-9


@pytest.fixture
def local_bucket() -> Iterator[LocalTokenBucket]:
    bucket = LocalTokenBucket()
    qps_bucket_replace(bucket)
    yield bucket
    qps_bucket_replace(None)


def test_a_grant_older_than_the_send_deadline_is_not_used(
    mcp_url: str, faults: FaultTransport, local_bucket: LocalTokenBucket
) -> None:
    server = server_add(name=f"late-{uuid.uuid4().hex[:6]}", url=mcp_url, max_qps=50)
    key = server_bucket_key(server_id=server.pk)
    local_bucket.reset(key=key)
    sent_before = len(faults.methods)

    def late_list(adapter: object) -> object:
        time.sleep(0.2)  # e.g. a GC pause between the grant and the send
        return adapter.list_tasks()  # type: ignore[attr-defined]

    with override_settings(TOOLOPS_QPS_SEND_DEADLINE_SECONDS=0.05):
        server_call(server=server, purpose="lookup", fn=late_list)
    stats = local_bucket.stats(key=key)
    # Two grants: the stale one abandoned (still spent), a fresh one for the request that left.
    assert stats.abandoned == 1
    assert stats.total == len(faults.methods) - sent_before == 1


def test_a_grant_within_the_deadline_is_used(
    mcp_url: str, faults: FaultTransport, local_bucket: LocalTokenBucket
) -> None:
    server = server_add(name=f"prompt-{uuid.uuid4().hex[:6]}", url=mcp_url, max_qps=50)
    key = server_bucket_key(server_id=server.pk)
    local_bucket.reset(key=key)
    with override_settings(TOOLOPS_QPS_SEND_DEADLINE_SECONDS=5.0):
        server_call(server=server, purpose="lookup", fn=lambda a: a.list_tasks())
    stats = local_bucket.stats(key=key)
    assert (stats.abandoned, stats.total) == (0, 1)


def test_server_add_negotiates_under_the_cap(mcp_url: str, local_bucket: LocalTokenBucket) -> None:
    local_bucket.reset(key=door_bucket_key(url=mcp_url))
    started = time.monotonic()
    server = server_add(name=f"door-{uuid.uuid4().hex[:6]}", url=mcp_url, max_qps=2)
    elapsed = time.monotonic() - started
    door = local_bucket.stats(key=door_bucket_key(url=mcp_url))
    # initialize, notifications/initialized, tools/list: each took a token at the door (the
    # benchmark's proxy sees exactly these three more requests than the server's own bucket).
    assert door.total == 3
    assert door.by_purpose == {"session": 3}
    # Three grants at <= 2 QPS need at least two intervals.
    assert elapsed >= 2 / wire_rate(cap=2) - 0.05
    # The new server's own bucket starts spent: its first request waits one interval.
    first = qps_bucket().take(key=server_bucket_key(server_id=server.pk), rate=wire_rate(cap=2),
                              purpose="poll")
    assert not first.granted and first.wait_s > 0
