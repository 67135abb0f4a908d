"""Reads of input rounds (an operation in INPUT_REQUIRED waits on one of these)."""

from __future__ import annotations

import uuid

from django.db.models import Q, QuerySet

from ledger.models import InputRequest


def input_request_get(*, operation_id: uuid.UUID, input_round: int) -> InputRequest | None:
    return InputRequest.objects.filter(operation_id=operation_id, round=input_round).first()


def input_requests_open() -> QuerySet[InputRequest]:
    return InputRequest.objects.filter(status=InputRequest.Status.OPEN).select_related("operation")


def input_rounds_waiting() -> QuerySet[InputRequest]:
    """Rounds an operator still owes: open, or answered but not delivered (no QPS token, server
    busy), which the operator answers again with the same JSON. An operation in INPUT_REQUIRED
    with such a round waits on a human, not on the executor."""
    return InputRequest.objects.filter(
        Q(status=InputRequest.Status.OPEN)
        | Q(status=InputRequest.Status.ANSWERED, delivered_at__isnull=True))
