"""The state table: every legal transition works, every illegal one is refused with nothing changed."""

from __future__ import annotations

import pytest
from django.forms.models import model_to_dict

from ledger.errors import IllegalTransition
from ledger.models import Operation, OperationEvent
from ledger.services.transitions import operation_transition
from ledger.states import ABSORBING, OPEN, TRANSITIONS, State
from tests.ledger.factories import OperationFactory

ALL_PAIRS = [(src, dst) for src in State for dst in State]
LEGAL = [(s, d) for s, d in ALL_PAIRS if d in TRANSITIONS[s]]
ILLEGAL = [(s, d) for s, d in ALL_PAIRS if d not in TRANSITIONS[s]]


def test_table_covers_every_state_and_matches_design() -> None:
    assert set(TRANSITIONS) == set(State)
    assert {State.ACCEPTED, State.CANCELLED_ACCEPTED, State.NOT_FOUND_SAFE} <= ABSORBING
    # docs/state-table.md, edge by edge
    for src, dst in [
        ("SUBMITTING", "WORKING"), ("WORKING", "INPUT_REQUIRED"), ("INPUT_REQUIRED", "WORKING"),
        ("SUBMITTING", "SUBMISSION_UNKNOWN"), ("SUBMISSION_UNKNOWN", "WORKING"),
        ("SUBMISSION_UNKNOWN", "NOT_FOUND_SAFE"), ("WORKING", "CANCEL_REQUESTED"),
        ("INPUT_REQUIRED", "CANCEL_REQUESTED"), ("WORKING", "TERMINAL_OBSERVED"),
        ("INPUT_REQUIRED", "TERMINAL_OBSERVED"), ("TERMINAL_OBSERVED", "FETCHING_RESULT"),
        ("FETCHING_RESULT", "ACCEPTED"), ("CANCEL_REQUESTED", "CANCELLED_ACCEPTED"),
        ("CANCEL_REQUESTED", "TERMINAL_OBSERVED"),
    ]:
        assert State(dst) in TRANSITIONS[State(src)], (src, dst)
    assert not (OPEN & ABSORBING)


@pytest.mark.django_db
@pytest.mark.parametrize(("src", "dst"), LEGAL, ids=[f"{s}->{d}" for s, d in LEGAL])
def test_legal_transition_moves_and_writes_one_event(src: State, dst: State) -> None:
    op = OperationFactory(state=src)
    operation_transition(operation_id=op.id, from_state=src, to_state=dst,
                         execution_epoch=op.execution_epoch, event_data={"why": "test"})
    op.refresh_from_db()
    assert op.state == dst
    events = list(OperationEvent.objects.filter(operation=op))
    assert [(e.from_state, e.to_state, e.seq) for e in events] == [(src, dst, 1)]


@pytest.mark.django_db
@pytest.mark.parametrize(("src", "dst"), ILLEGAL, ids=[f"{s}->{d}" for s, d in ILLEGAL])
def test_illegal_transition_is_refused_and_changes_nothing(src: State, dst: State) -> None:
    op = OperationFactory(state=src)
    before = model_to_dict(Operation.objects.get(id=op.id))
    with pytest.raises(IllegalTransition):
        operation_transition(operation_id=op.id, from_state=src, to_state=dst,
                             execution_epoch=op.execution_epoch)
    assert model_to_dict(Operation.objects.get(id=op.id)) == before
    assert not OperationEvent.objects.filter(operation=op).exists()


@pytest.mark.django_db
def test_stale_from_state_epoch_generation_or_lease_is_refused() -> None:
    op = OperationFactory(state=State.WORKING, execution_epoch=2, cancel_generation=1,
                          lease_owner="me")
    before = model_to_dict(Operation.objects.get(id=op.id))
    attempts = [
        {"from_state": State.INPUT_REQUIRED, "execution_epoch": 2},  # row is not in that state
        {"from_state": State.WORKING, "execution_epoch": 1},  # older epoch
        {"from_state": State.WORKING, "execution_epoch": 2, "cancel_generation": 0},
        {"from_state": State.WORKING, "execution_epoch": 2, "lease_owner": "someone-else"},
    ]
    for kwargs in attempts:
        with pytest.raises(IllegalTransition):
            operation_transition(operation_id=op.id, to_state=State.TERMINAL_OBSERVED, **kwargs)
    assert model_to_dict(Operation.objects.get(id=op.id)) == before
    assert not OperationEvent.objects.filter(operation=op).exists()


@pytest.mark.django_db
def test_state_and_epoch_cannot_be_smuggled_through_updates() -> None:
    op = OperationFactory(state=State.WORKING)
    with pytest.raises(ValueError):
        operation_transition(operation_id=op.id, from_state=State.WORKING,
                             to_state=State.TERMINAL_OBSERVED, execution_epoch=1,
                             updates={"execution_epoch": 5})
    op.refresh_from_db()
    assert op.state == State.WORKING and op.execution_epoch == 1
