"""Guarded transitions: the multi-hop path write and the multi-event append, on the real database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from ledger.errors import IllegalTransition
from ledger.models import Operation, OperationEvent
from ledger.services.events import EventSpec, event_append_locked, event_append_many_locked
from ledger.services.transitions import Hop, operation_transition_path
from ledger.states import State
from tests.ledger.factories import OperationFactory

RESULT = {"kind": "result", "payload": {"content": [{"type": "text", "text": "ok"}]},
          "is_error": False, "status_message": ""}


def _leased(**fields: object) -> Operation:
    until = timezone.now() + timedelta(seconds=60)
    return OperationFactory(lease_owner="w1", lease_expires_at=until, next_poll_at=until, **fields)


def _path() -> list[Hop]:
    return [
        Hop(to_state=State.TERMINAL_OBSERVED, event_kind="terminal_observed",
            event_data={"status": "completed"}),
        Hop(to_state=State.FETCHING_RESULT, event_kind="fetching_result"),
        Hop(to_state=State.FETCHING_RESULT, event_kind="result_fetched",
            event_data={"result_digest": "sha256:r"}),
    ]


def _kinds(op: Operation) -> list[tuple[int, str, str, str]]:
    return list(OperationEvent.objects.filter(operation=op).order_by("seq")
                .values_list("seq", "kind", "from_state", "to_state"))


@pytest.mark.django_db
def test_a_path_is_one_write_with_its_events_in_order_and_reads_the_row_back() -> None:
    op = _leased(server_state="working", cancel_generation=0)
    with transaction.atomic():
        event_append_locked(operation_id=op.id, kind="created", execution_epoch=op.execution_epoch,
                            cancel_generation=0)
    locked = operation_transition_path(
        operation_id=op.id, from_state=State.WORKING, hops=_path(),
        execution_epoch=op.execution_epoch, lease_owner="w1",
        updates={"terminal_status": "completed", "server_state": "completed", "result": RESULT,
                 "result_kind": "result", "result_digest": "sha256:r"},
        returning=("call_node_id", "remote_id", "input_round", "shadow", "terminal_status"),
    )
    op.refresh_from_db()
    assert op.state == State.FETCHING_RESULT and op.result == RESULT and op.result_digest == "sha256:r"
    assert locked == {"cancel_generation": 0, "server_state": "completed", "call_node_id": op.call_node_id,
                      "remote_id": op.remote_id, "input_round": 0, "shadow": False,
                      "terminal_status": "completed"}
    assert _kinds(op) == [
        (1, "created", "", ""),
        (2, "terminal_observed", State.WORKING, State.TERMINAL_OBSERVED),
        (3, "fetching_result", State.TERMINAL_OBSERVED, State.FETCHING_RESULT),
        (4, "result_fetched", State.FETCHING_RESULT, State.FETCHING_RESULT),
    ]
    events = OperationEvent.objects.filter(operation=op, seq__gt=1).order_by("seq")
    assert [e.data for e in events] == [{"status": "completed"}, {}, {"result_digest": "sha256:r"}]
    assert {e.server_state for e in events} == {"completed"}


@pytest.mark.django_db
@pytest.mark.parametrize("guard", ["state", "epoch", "lease"])
def test_a_path_that_does_not_match_the_row_writes_nothing(guard: str) -> None:
    op = _leased(state=State.CANCEL_REQUESTED if guard == "state" else State.WORKING)
    with pytest.raises(IllegalTransition, match="refused"):
        operation_transition_path(
            operation_id=op.id, from_state=State.WORKING, hops=_path(),
            execution_epoch=op.execution_epoch + (1 if guard == "epoch" else 0),
            lease_owner="w2" if guard == "lease" else "w1",
            updates={"terminal_status": "completed"}, returning=(),
        )
    assert Operation.objects.get(id=op.id).terminal_status == ""
    assert _kinds(op) == []


@pytest.mark.django_db
def test_a_path_with_a_move_outside_the_state_table_is_refused_before_any_write() -> None:
    op = _leased()
    with pytest.raises(IllegalTransition, match="not in the state table"):
        operation_transition_path(
            operation_id=op.id, from_state=State.WORKING,
            hops=[Hop(to_state=State.ACCEPTED, event_kind="accepted")],
            execution_epoch=op.execution_epoch, lease_owner="w1", updates={}, returning=(),
        )
    assert Operation.objects.get(id=op.id).state == State.WORKING


@pytest.mark.django_db
def test_many_events_continue_the_series_after_single_appends() -> None:
    op = _leased()
    with transaction.atomic():
        event_append_locked(operation_id=op.id, kind="a", execution_epoch=0, cancel_generation=0)
        written = event_append_many_locked(
            operation_id=op.id, execution_epoch=0, cancel_generation=2, server_state="working",
            events=[EventSpec(kind="b", data={"n": 1}), EventSpec(kind="c")])
        event_append_locked(operation_id=op.id, kind="d", execution_epoch=0, cancel_generation=0)
    assert written == 2
    assert [k for _, k, _, _ in _kinds(op)] == ["a", "b", "c", "d"]
    assert [s for s, _, _, _ in _kinds(op)] == [1, 2, 3, 4]
    b = OperationEvent.objects.get(operation=op, kind="b")
    assert (b.data, b.cancel_generation, b.server_state) == ({"n": 1}, 2, "working")


@pytest.mark.django_db
def test_a_guard_on_none_means_is_null_as_in_the_orm() -> None:
    from ledger.services.transitions import operation_write_guarded

    op = _leased(expires_at=None)
    assert operation_write_guarded(
        operation_id=op.id, state=State.WORKING, execution_epoch=op.execution_epoch,
        lease_owner="w1", updates={"polls_count": 7}, extra_filters={"expires_at": None})
    assert Operation.objects.get(id=op.id).polls_count == 7


@pytest.mark.django_db(transaction=True)
def test_a_path_hands_its_events_to_the_caller_who_writes_them_in_the_same_transaction() -> None:
    op = _leased(server_state="working", cancel_generation=0)
    updates = {"terminal_status": "completed", "server_state": "completed"}
    pending: list[EventSpec] = []
    # Outside a transaction there is no "later in this transaction": refused before any write.
    with pytest.raises(RuntimeError):
        operation_transition_path(
            operation_id=op.id, from_state=State.WORKING, hops=_path(),
            execution_epoch=op.execution_epoch, lease_owner="w1", updates=updates, returning=(),
            events_out=pending)
    op.refresh_from_db()
    assert op.state == State.WORKING and pending == []
    with transaction.atomic():
        locked = operation_transition_path(
            operation_id=op.id, from_state=State.WORKING, hops=_path(),
            execution_epoch=op.execution_epoch, lease_owner="w1", updates=updates, returning=(),
            events_out=pending)
        assert not OperationEvent.objects.filter(operation=op).exists()
        assert [(e.kind, e.from_state, e.to_state) for e in pending] == [
            ("terminal_observed", State.WORKING, State.TERMINAL_OBSERVED),
            ("fetching_result", State.TERMINAL_OBSERVED, State.FETCHING_RESULT),
            ("result_fetched", State.FETCHING_RESULT, State.FETCHING_RESULT),
        ]
        event_append_many_locked(operation_id=op.id, events=pending,
                                 execution_epoch=op.execution_epoch,
                                 cancel_generation=locked["cancel_generation"],
                                 server_state=locked["server_state"])
    assert [k for _, k, _, _ in _kinds(op)] == ["terminal_observed", "fetching_result", "result_fetched"]
