"""The dispatcher tops the poll queue up to its cap: rows beyond the room stay due in the ledger."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.models import Operation
from ledger.states import State
from tests.ledger.factories import OperationFactory, ToolServerFactory
from toolops.services.dispatch import operations_dispatch_due

pytestmark = pytest.mark.django_db(transaction=True)


def _due_rows(n: int) -> list[uuid.UUID]:
    server = ToolServerFactory()
    rows = OperationFactory.build_batch(n, server=server, state=State.WORKING,
                                        next_poll_at=timezone.now() - timedelta(seconds=1))
    Operation.objects.bulk_create(rows)
    return [r.id for r in rows]


def test_no_room_claims_nothing_and_a_little_room_claims_that_much() -> None:
    ids = _due_rows(5)
    sent: list[uuid.UUID] = []
    assert operations_dispatch_due(enqueue=lambda op_id, owner: sent.append(op_id), room=0) == 0
    assert sent == [] and not Operation.objects.exclude(lease_owner="").exists()
    assert operations_dispatch_due(enqueue=lambda op_id, owner: sent.append(op_id), room=3) == 3
    assert len(sent) == 3 and set(sent) <= set(ids)
    leased = Operation.objects.exclude(lease_owner="")
    # A claimed row is not due again before its lease ends.
    assert all(op.next_poll_at == op.lease_expires_at for op in leased)
    assert operations_dispatch_due(enqueue=lambda op_id, owner: sent.append(op_id)) == 2
    assert sorted(sent) == sorted(ids)
