"""Which server requests read from a task's input channel open new input rounds.

Kept apart from the round services (toolops/services/inputs.py) because the rule is subtle: the
spec forbids a requestor to reuse a request id within a session, yet mcp 1.30 does, so "an id we
have seen" alone cannot tell a replay from the server's next question.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from adapters.base import ServerRequest
from ledger.models import InputRequest


def request_key(request_id: str | int) -> str:
    # JSON spelling keeps the id's type: "5" (a string) and 5 (a number) are different ids.
    return json.dumps(request_id)


def requests_distinct(requests: list[ServerRequest]) -> list[ServerRequest]:
    """The first of each request id in one read: a request sent twice in one window is one round."""
    seen: set[str] = set()
    distinct = []
    for request in requests:
        key = request_key(request.request_id)
        if key not in seen:
            seen.add(key)
            distinct.append(request)
    return distinct


def delivered_request_keys(*, operation_id: uuid.UUID) -> frozenset[str]:
    """Server request ids whose every round so far has had its answer delivered."""
    delivered: set[str] = set()
    waiting: set[str] = set()
    for key, delivered_at in InputRequest.objects.filter(operation_id=operation_id).values_list(
            "server_request_id", "delivered_at"):
        (delivered if delivered_at is not None else waiting).add(key)
    return frozenset(delivered - waiting)


def _content(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k != "_meta"}


def requests_unseen(
    *, operation_id: uuid.UUID, requests: list[ServerRequest], delivered_before: frozenset[str],
    read_started: float,
) -> tuple[list[ServerRequest], list[str]]:
    """The requests that open new rounds, and which of them reuse an earlier round's id.

    A request whose id no round has is new. One whose id belongs to a round still waiting for
    delivery is a replay. The spec forbids reusing a request id in a session, yet mcp 1.30 does
    (its ids end in `id(params)`, an address CPython recycles), so an id whose rounds were all
    delivered is new again when the request is provably another one: its content differs, or it
    came on a stream opened after the answer was delivered (a server hands a stream request out
    once, so the answered one cannot come again). Anything else is treated as the replay it may be.
    """
    distinct = requests_distinct(requests)
    # One read of every earlier round these ids name, not one per request.
    earlier_by_key: dict[str, list[tuple[Any, dict[str, Any]]]] = {}
    for key, delivered_at, params in InputRequest.objects.filter(
            operation_id=operation_id,
            server_request_id__in=[request_key(r.request_id) for r in distinct],
    ).values_list("server_request_id", "delivered_at", "params"):
        earlier_by_key.setdefault(key, []).append((delivered_at, params))
    fresh: list[ServerRequest] = []
    reused: list[str] = []
    for request in distinct:
        key = request_key(request.request_id)
        earlier = earlier_by_key.get(key, [])
        if earlier:
            all_delivered = all(delivered_at is not None for delivered_at, _ in earlier)
            other_content = all(_content(params) != _content(request.params)
                                for _, params in earlier)
            after_delivery = (key in delivered_before and request.stream_opened_at is not None
                              and request.stream_opened_at > read_started)
            if not (all_delivered and (other_content or after_delivery)):
                continue
            reused.append(key)
        fresh.append(request)
    return fresh, reused
