"""Which input rounds an operator still owes (ledger/selectors/inputs.py)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from ledger.models import InputRequest
from ledger.selectors.inputs import input_rounds_waiting
from tests.ledger.factories import InputRequestFactory

pytestmark = pytest.mark.django_db


def test_open_and_answered_but_undelivered_rounds_wait_on_a_human() -> None:
    now = timezone.now()
    open_round = InputRequestFactory()
    undelivered = InputRequestFactory(status=InputRequest.Status.ANSWERED, answered_at=now)
    InputRequestFactory(status=InputRequest.Status.ANSWERED, answered_at=now, delivered_at=now)
    InputRequestFactory(status=InputRequest.Status.EXPIRED)
    InputRequestFactory(status=InputRequest.Status.WITHDRAWN)
    assert set(input_rounds_waiting().values_list("pk", flat=True)) == {open_round.pk, undelivered.pk}
