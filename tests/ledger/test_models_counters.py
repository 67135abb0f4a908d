"""The counters and versions of the ledger's rows: never negative, held by one CHECK constraint
per table (ledger/models/operations.py, NOT_NEGATIVE)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction

from ledger.models import Operation, OperationEvent, TerminalReceipt
from tests.ledger.factories import OperationFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("field", ["poll_attempts", "observation_seq", "poll_interval_ms",
                                   "polls_count", "poll_errors_in_row", "input_round",
                                   "cancel_generation", "ttl_ms"])
def test_a_negative_operation_counter_is_refused_by_the_database(field: str) -> None:
    op = OperationFactory()
    with pytest.raises(IntegrityError, match="op_counters_not_negative"), transaction.atomic():
        Operation.objects.filter(id=op.id).update(**{field: -1})
    # NULL is no number: the nullable ones may be unset.
    if Operation._meta.get_field(field).null:
        assert Operation.objects.filter(id=op.id).update(**{field: None}) == 1


@pytest.mark.parametrize(("model", "field", "constraint"), [
    (OperationEvent, "seq", "event_counters_not_negative"),
    (OperationEvent, "cancel_generation", "event_counters_not_negative"),
    (TerminalReceipt, "execution_epoch", "receipt_counters_not_negative"),
    (TerminalReceipt, "cancel_generation", "receipt_counters_not_negative"),
])
def test_a_negative_event_or_receipt_counter_is_refused_by_the_database(
        model: type[OperationEvent | TerminalReceipt], field: str, constraint: str) -> None:
    op = OperationFactory()
    fields: dict[str, object] = {"operation": op, "execution_epoch": 1, "cancel_generation": 0}
    if model is OperationEvent:
        fields.update(seq=1, kind="created")
    else:
        fields.update(call_node_id=op.call_node_id, terminal_status="completed",
                      request_digest="sha256:r", descriptor_version="v1")
    fields[field] = -1
    with pytest.raises(IntegrityError, match=constraint), transaction.atomic():
        model.objects.create(**fields)


def test_validation_refuses_a_negative_counter_and_an_epoch_below_one() -> None:
    op = OperationFactory.build()
    op.polls_count = -1
    op.execution_epoch = 0
    with pytest.raises(ValidationError) as refused:
        op.full_clean(exclude=["server"])
    assert {"polls_count", "execution_epoch"} <= set(refused.value.message_dict)


def test_the_hot_tables_keep_few_check_constraints() -> None:
    # PostgreSQL rebuilds each CHECK constraint of a table for every statement writing a row of
    # it: a column-by-column constraint coming back (a Positive*Field) would cost every write.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conrelid::regclass::text, count(*) FROM pg_constraint WHERE contype = 'c' "
            "AND conrelid::regclass::text = ANY(%s) GROUP BY 1",
            [["ledger_operation", "ledger_operationevent", "ledger_terminalreceipt"]])
        counts = dict(cursor.fetchall())
    assert counts == {"ledger_operation": 6, "ledger_operationevent": 1,
                      "ledger_terminalreceipt": 2}
