"""The hot path's one-statement inserts: a skipped conflict leaves the transaction usable."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.db.models.signals import pre_save
from django.test.utils import CaptureQueriesContext

from ledger.models import OutboxEvent, TerminalReceipt
from ledger.services.inserts import one_statement_pair, row_insert
from ledger.states import State
from tests.ledger.factories import OperationFactory


def _receipt(op: object, **overrides: object) -> TerminalReceipt:
    fields: dict[str, object] = {
        "operation": op, "call_node_id": op.call_node_id,  # type: ignore[attr-defined]
        "execution_epoch": 1, "terminal_status": "completed", "request_digest": "sha256:r",
        "remote_id": "t-1", "descriptor_version": "v1", "cancel_generation": 0,
        "result_digest": "sha256:d",
    }
    fields.update(overrides)
    return TerminalReceipt(**fields)


@pytest.mark.django_db(transaction=True)
def test_a_conflicting_row_is_skipped_and_the_transaction_goes_on() -> None:
    op = OperationFactory(state=State.FETCHING_RESULT)
    first = row_insert(_receipt(op), skip_conflict=True)
    assert first is not None and first.pk is not None
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        # The same operation (a one-to-one) and the same call node and epoch: both unique.
        assert row_insert(_receipt(op), skip_conflict=True) is None
        # Still usable: PostgreSQL would refuse every statement here after an IntegrityError.
        assert TerminalReceipt.objects.filter(operation=op).count() == 1
    assert not any("SAVEPOINT" in q["sql"] for q in captured.captured_queries)
    assert TerminalReceipt.objects.get(operation=op).pk == first.pk


@pytest.mark.django_db(transaction=True)
def test_a_violation_that_is_not_a_conflict_still_raises() -> None:
    op = OperationFactory(state=State.FETCHING_RESULT)
    with pytest.raises(IntegrityError), transaction.atomic():
        # The CHECK on the status: skipping conflicts never hides a row the schema refuses.
        row_insert(_receipt(op, terminal_status="working"), skip_conflict=True)
    assert not TerminalReceipt.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_without_skip_a_conflict_raises() -> None:
    op = OperationFactory(state=State.FETCHING_RESULT)
    row_insert(_receipt(op))
    with pytest.raises(IntegrityError), transaction.atomic():
        row_insert(_receipt(op))


def test_a_pair_is_one_statement_only_where_no_save_hook_would_be_skipped() -> None:
    expected = connections["default"] if connection.vendor == "postgresql" else None
    assert one_statement_pair(TerminalReceipt, OutboxEvent) is expected

    def hook(**_kwargs: object) -> None:
        pass

    pre_save.connect(hook, sender=OutboxEvent)
    try:
        assert one_statement_pair(TerminalReceipt, OutboxEvent) is None
    finally:
        pre_save.disconnect(hook, sender=OutboxEvent)
    assert one_statement_pair(TerminalReceipt, OutboxEvent) is expected
