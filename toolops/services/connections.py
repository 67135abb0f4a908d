"""Adapters per tool server, cached per process so HTTP connections are pooled, and the one gate
every protocol call passes: `server_call` takes a token from the server's QPS bucket first.

The cache key includes the session id: when a session is replaced, the old adapter is not reused.

The cap counts HTTP requests, not adapter calls: one call can send several (a key lookup then
`tasks/get`, AIP-151's cancel then Get and its in-call retries). Every adapter made here carries a
request gate. `server_call` takes the first request's token before anything is built (a refusal
costs nothing), and the gate charges each further request of the same call one more token, as a
follow-up that may wait briefly in place.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

import httpx
from django.conf import settings
from django.utils import timezone

from adapters import TaskAdapter, TransientError, adapter_for
from adapters.base import RequestGate
from adapters.registry import Bounds
from ledger.models import ToolServer
from ledger.services.schedule import operations_poll_sooner
from toolops.metrics import qps_token_denied_inc
from toolops.qps import (
    door_bucket_key,
    qps_bucket,
    retry_spread_seconds,
    send_deadline_seconds,
    server_bucket_key,
    wire_rate,
)
from toolops.services.server_transport import ServerTransport, server_transport

T = TypeVar("T")
logger = logging.getLogger("toolops.qps")


def qps_grant_expired(*, server: ToolServer, purpose: str) -> None:
    """A grant passed its send deadline unused: the counters say it was not a request."""
    logger.debug("QPS grant for %s passed its send deadline; re-gated", server.name)
    qps_bucket().abandon(key=server_bucket_key(server_id=server.pk), purpose=purpose)


# The protocol calls that count against a server's cap (all of them: the cap is per server).
# "session": a re-initialisation after a lost session, and any request outside `server_call`.
PURPOSES = frozenset({"submit", "poll", "result", "cancel", "lookup", "input", "session"})

STATUS_NOTIFICATION = "notifications/tasks/status"

_lock = threading.Lock()
_cache: dict[tuple[int, str, str, str], TaskAdapter] = {}
# Each cached adapter's transport (URL policy at connect time, credentials at send time).
_transports: dict[tuple[int, str, str, str], ServerTransport] = {}
_transport_factory: Callable[[ToolServer], httpx.BaseTransport | None] | None = None
_rng = random.SystemRandom()
# The `server_call` running on this thread: its gate charges its requests to this scope.
_scope = threading.local()


@dataclass
class _CallScope:
    server: ToolServer
    purpose: str
    prepaid: int  # requests already paid for: server_call's up-front token
    # time.monotonic() just BEFORE the up-front take: the grant happened after it, so its age
    # measured from here is never under-estimated (a slow bucket reply counts against it).
    granted_at: float = 0.0


# Longest in-place wait for a follow-up call's token: a worker slot is held meanwhile, so keep it
# short; servers capped under 1 QPS re-schedule instead.
FOLLOW_UP_MAX_WAIT_SECONDS = 2.0
# Longest in-place wait for a poll's slot in the server's line (toolops.qps): a poll is not worth
# holding a worker slot long, only long enough to spare a re-claim when the slot is a token or two
# away (fast servers); a slower server's poll goes back to the ledger until its slot.
LINE_MAX_WAIT_SECONDS = 0.25


class RateLimited(TransientError):
    """No token for this server now. Nothing was sent; the caller re-schedules at `retry_at`.

    A TransientError (provably not sent, retry later), so call sites that handle adapter errors
    generically (cancel, input, lookup) already do the right thing; hot paths (poll, result)
    catch it first for a cheaper reschedule.
    """

    def __init__(self, *, server_id: int, purpose: str, retry_at: datetime) -> None:
        super().__init__(
            f"server {server_id}: QPS cap reached for {purpose}; nothing sent",
            detail={"purpose": purpose, "retry_at": retry_at.isoformat()},
            retry_after=max((retry_at - timezone.now()).total_seconds(), 0.0),
        )
        self.server_id = server_id
        self.purpose = purpose
        self.retry_at = retry_at


def connections_use_transport(factory: Callable[[ToolServer], httpx.BaseTransport | None] | None) -> None:
    """Route new adapters through an httpx transport (fault-injecting proxies, in-process peers)."""
    global _transport_factory
    adapters_close_all()
    _transport_factory = factory


def settings_bounds() -> Bounds:
    """The per-request deadline and the response size cap every adapter is built with."""
    return Bounds(request_deadline_s=float(settings.TOOLOPS_REQUEST_DEADLINE_SECONDS),
                  max_response_bytes=int(settings.TOOLOPS_MAX_RESULT_BYTES))


def adapter_for_server(*, server: ToolServer) -> TaskAdapter:
    key = (server.pk, server.adapter_version, server.url, server.session_id)
    with _lock:
        adapter = _cache.get(key)
        if adapter is None:
            inner = _transport_factory(server) if _transport_factory is not None else None
            transport = server_transport(credentials=server.credentials, inner=inner)
            _transports[key] = transport
            adapter = adapter_for(
                version=server.adapter_version,
                url=server.url,
                session_id=server.session_id or None,
                timeout_s=float(settings.TOOLOPS_HTTP_TIMEOUT_SECONDS),
                # Adapter settings negotiation stored (AIP-151: the configured methods).
                options=(server.capabilities or {}).get("adapter_options"),
                transport=transport,
                bounds=settings_bounds(),
            )
            adapter.set_request_gate(server_request_gate(server=server))
            _cache[key] = adapter
        return adapter


def server_token_take(*, server: ToolServer, purpose: str, follow_up: bool = False,
                      holder: str | None = None) -> float:
    """Take one token or raise RateLimited with the time to come back.

    `holder` (the operation's id) puts a refused caller in the server's line (toolops.qps, "the
    line"): it is told its slot and comes back exactly then. A caller with no holder is told a
    retry time spread over the callers refused this second.

    `follow_up` marks the second call of one observation (the input read or result fetch right
    after a `get` that said so), or a call a person is waiting on (cancel, input delivery). It may
    wait in place for up to two token intervals: refusing it would hand the row back, and the next
    cycle would spend its token on the `get` again, so the follow-up could starve behind its poll.
    It stands outside the line (its holder is ignored), like any call that is already under way.
    """
    if purpose not in PURPOSES:
        raise ValueError(f"unknown call purpose {purpose!r}; known: {sorted(PURPOSES)}")
    # Spaced for arrivals at the server, not grants here (toolops/qps.py, "the cap at the wire").
    rate = wire_rate(cap=float(server.max_qps))
    bucket, key = qps_bucket(), server_bucket_key(server_id=server.pk)
    # Returned on a grant: time.monotonic() just before the take that granted (see _CallScope).
    asked_at = time.monotonic()
    in_line = None if follow_up else holder
    take = bucket.take(key=key, rate=rate, purpose=purpose, holder=in_line)
    inline_wait = float(settings.TOOLOPS_QPS_INLINE_WAIT_SECONDS)
    if follow_up:
        inline_wait = max(inline_wait, min(2.0 / rate, FOLLOW_UP_MAX_WAIT_SECONDS))
    elif take.queued:
        # A holder whose slot is that close: waiting holds a worker slot for at most two token
        # intervals, handing the row back costs a claim, a load and a write.
        inline_wait = max(inline_wait, min(2.0 / rate, LINE_MAX_WAIT_SECONDS))
    if not take.granted and take.wait_s <= inline_wait:
        # The token (or this caller's slot) is due within a few milliseconds: one timed wait
        # (never a loop) costs less than handing the row back to the ledger and claiming it again.
        time.sleep(take.wait_s)
        asked_at = time.monotonic()
        take = bucket.take(key=key, rate=rate, purpose=purpose, holder=in_line)
    if take.granted:
        # A grant prefetched by an earlier take counts its send deadline from that take.
        return asked_at if take.asked_at is None else take.asked_at
    qps_token_denied_inc(server=server.name)
    if take.queued:
        # A slot in the line: the line already spaces the refused callers one token apart.
        delay = take.wait_s
    else:
        # Full jitter over the time the bucket needs to serve everyone refused this second: the
        # refused callers come back spread out, not as one herd at the next refill.
        delay = take.wait_s + _rng.uniform(0.0, retry_spread_seconds(take=take, rate=rate))
    raise RateLimited(server_id=server.pk, purpose=purpose,
                      retry_at=timezone.now() + timedelta(seconds=delay))


def server_request_gate(*, server: ToolServer, purpose: str = "session") -> RequestGate:
    """The gate an adapter of `server` passes before each HTTP request (adapters.base.RequestGate).

    Inside `server_call` on this thread, the call's first request uses the token the call already
    took and each further one takes its own, charged to the call's purpose. Outside one (a
    re-initialisation, a request some future path sends directly) every request takes a token
    under `purpose`. Either way a refusal is RateLimited, a TransientError: nothing was sent.
    """
    server_id = server.pk

    def gate(what: str) -> None:
        scope: _CallScope | None = getattr(_scope, "call", None)
        if scope is not None and scope.server.pk == server_id:
            if scope.prepaid > 0:
                scope.prepaid -= 1
                if time.monotonic() - scope.granted_at <= send_deadline_seconds():
                    return
                # The up-front grant is too old to be used now: sent late, this request could
                # reach the server close behind one granted after it. It stays spent (never
                # handed back: its slot is past) and the request takes a fresh grant.
                qps_grant_expired(server=scope.server, purpose=scope.purpose)
            server_token_take(server=scope.server, purpose=scope.purpose, follow_up=True)
            return
        server_token_take(server=server, purpose=purpose, follow_up=True)

    return gate


# A person waits on `server-add`: its negotiation waits for tokens instead of failing.
DOOR_MAX_WAIT_SECONDS = 30.0


def door_request_gate(*, url: str, max_qps: float) -> RequestGate:
    """The gate for a server that has no row yet (the negotiation at `server-add`): the same cap,
    on a bucket keyed by its URL. `server_add` then empties the new server's own bucket, so its
    first request waits one interval after the last negotiation request."""
    rate = wire_rate(cap=float(max_qps))
    key = door_bucket_key(url=url)

    def gate(what: str) -> None:
        give_up = time.monotonic() + DOOR_MAX_WAIT_SECONDS
        while True:
            take = qps_bucket().take(key=key, rate=rate, purpose="session")
            if take.granted:
                return
            if time.monotonic() + take.wait_s > give_up:
                raise TransientError(f"{what}: no QPS token for {url} within "
                                     f"{DOOR_MAX_WAIT_SECONDS:.0f}s; nothing sent")
            time.sleep(take.wait_s)

    return gate


def server_bucket_hand_over(*, server: ToolServer) -> None:
    """The negotiation just used the door: the server's own bucket starts empty."""
    qps_bucket().spend(key=server_bucket_key(server_id=server.pk))


def server_call(*, server: ToolServer, purpose: str, fn: Callable[[TaskAdapter], T],
                follow_up: bool = False, holder: str | None = None) -> T:
    """Run one adapter call under the server's QPS cap: one token per HTTP request it sends.

    The first token is taken before anything else, so a refusal (RateLimited) sends nothing.
    `holder`: the operation the call is for, so a refusal queues it (server_token_take).
    """
    asked_at = server_token_take(server=server, purpose=purpose, follow_up=follow_up,
                                 holder=holder)
    adapter = adapter_for_server(server=server)
    outer = getattr(_scope, "call", None)
    _scope.call = _CallScope(server=server, purpose=purpose, prepaid=1, granted_at=asked_at)
    try:
        result = fn(adapter)
    finally:
        _scope.call = outer
    _pushed_status_poll_sooner(server=server, adapter=adapter)
    return result


def _pushed_status_poll_sooner(*, server: ToolServer, adapter: TaskAdapter) -> None:
    """Status notifications the server pushed on a stream we had open: poll those tasks sooner."""
    queue = getattr(adapter, "notifications", None)
    if not queue:
        return
    with _lock:
        messages = list(queue)
        queue.clear()
        # Other notifications stay for whoever reads them; only status pushes are consumed here.
        queue.extend(m for m in messages if m.get("method") != STATUS_NOTIFICATION)
    task_ids = [
        str(m["params"]["taskId"]) for m in messages
        if m.get("method") == STATUS_NOTIFICATION and isinstance(m.get("params"), dict)
        and isinstance(m["params"].get("taskId"), str)
    ]
    operations_poll_sooner(server_id=server.pk, remote_ids=task_ids)


def adapters_close_all() -> None:
    with _lock:
        for adapter in _cache.values():
            adapter.close()
        _cache.clear()
        for transport in _transports.values():
            transport.close()
        _transports.clear()
