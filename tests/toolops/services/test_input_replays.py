"""Which requests read from the input channel open rounds: replays never, reused ids when provable."""

from __future__ import annotations

import time

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from adapters.base import ServerRequest
from ledger.models import InputRequest, Operation
from tests.ledger.factories import InputRequestFactory, OperationFactory
from toolops.services.input_replays import (
    delivered_request_keys,
    request_key,
    requests_distinct,
    requests_unseen,
)

pytestmark = pytest.mark.django_db

QUESTION = {"message": "colour?", "requestedSchema": {}}


def _request(request_id: str | int, *, params: dict | None = None,
             stream_opened_at: float | None = None) -> ServerRequest:
    return ServerRequest(request_id=request_id, method="elicitation/create",
                         params={**(params or QUESTION), "_meta": {"related": "t"}},
                         related_task_id=None, stream_opened_at=stream_opened_at)


def _round(op: Operation, *, n: int, request_id: str, delivered: bool,
           params: dict | None = None) -> InputRequest:
    return InputRequestFactory(operation=op, round=n, server_request_id=request_key(request_id),
                               params=params or QUESTION,
                               delivered_at=timezone.now() if delivered else None)


def _decide(op: Operation, requests: list[ServerRequest], *, delivered_before: frozenset[str],
            read_started: float) -> tuple[list[str | int], list[str]]:
    fresh, reused = requests_unseen(operation_id=op.id, requests=requests,
                                    delivered_before=delivered_before, read_started=read_started)
    return [r.request_id for r in fresh], reused


def test_a_new_id_opens_a_round_and_one_waiting_for_delivery_is_a_replay() -> None:
    op = OperationFactory()
    _round(op, n=1, request_id="r1", delivered=False)
    started = time.monotonic()
    # Even on a stream opened after the read began: round 1 has no answer at the server yet.
    requests = [_request("r1", stream_opened_at=started + 1), _request("r2")]
    assert _decide(op, requests, delivered_before=delivered_request_keys(operation_id=op.id),
                   read_started=started) == (["r2"], [])


def test_a_delivered_id_with_the_same_question_is_a_replay_unless_a_later_stream_carried_it(
) -> None:
    op = OperationFactory()
    _round(op, n=1, request_id="r1", delivered=True)
    before = delivered_request_keys(operation_id=op.id)
    assert before == {request_key("r1")}
    started = time.monotonic()
    # Kept from a reply, or on a stream opened before the read: it may be the answered request.
    assert _decide(op, [_request("r1")], delivered_before=before, read_started=started) == ([], [])
    assert _decide(op, [_request("r1", stream_opened_at=started - 1)], delivered_before=before,
                   read_started=started) == ([], [])
    # A stream opened after the delivery was seen can only carry a request dequeued after it.
    assert _decide(op, [_request("r1", stream_opened_at=started + 1)], delivered_before=before,
                   read_started=started) == (["r1"], [request_key("r1")])
    # Delivered only after the read began: the stream may predate the answer.
    assert _decide(op, [_request("r1", stream_opened_at=started + 1)], delivered_before=frozenset(),
                   read_started=started) == ([], [])


def test_a_delivered_id_with_another_question_is_a_new_round_however_it_came() -> None:
    op = OperationFactory()
    _round(op, n=1, request_id="r1", delivered=True)
    other = {"message": "colour? (2/2)", "requestedSchema": {}}
    assert _decide(op, [_request("r1", params=other)], delivered_before=frozenset(),
                   read_started=time.monotonic()) == (["r1"], [request_key("r1")])


def test_an_id_whose_later_round_still_waits_is_a_replay() -> None:
    op = OperationFactory()
    _round(op, n=1, request_id="r1", delivered=True)
    _round(op, n=2, request_id="r1", delivered=False, params={"message": "again", "requestedSchema": {}})
    started = time.monotonic()
    assert delivered_request_keys(operation_id=op.id) == frozenset()
    assert _decide(op, [_request("r1", params={"message": "third", "requestedSchema": {}},
                                 stream_opened_at=started + 1)],
                   delivered_before=frozenset({request_key("r1")}), read_started=started) == ([], [])


def test_the_same_request_twice_in_one_read_opens_one_round_and_ids_keep_their_type() -> None:
    op = OperationFactory()
    assert _decide(op, [_request("5"), _request("5"), _request(5)], delivered_before=frozenset(),
                   read_started=time.monotonic()) == (["5", 5], [])


def test_requests_distinct_keeps_the_first_of_each_id_in_read_order() -> None:
    first, other = _request(7), _request("7")
    again = _request(7, params={"message": "x", "requestedSchema": {}})
    assert requests_distinct([first, again, other]) == [first, other]


def test_the_database_refuses_two_undelivered_rounds_with_one_id_and_allows_reuse_after_delivery(
) -> None:
    op = OperationFactory()
    first = _round(op, n=1, request_id="r1", delivered=False)
    with pytest.raises(IntegrityError), transaction.atomic():
        _round(op, n=2, request_id="r1", delivered=False)
    InputRequest.objects.filter(pk=first.pk).update(delivered_at=timezone.now())
    _round(op, n=2, request_id="r1", delivered=False)
    assert InputRequest.objects.filter(operation=op, server_request_id=request_key("r1")).count() == 2
