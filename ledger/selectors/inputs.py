"""Reads of input rounds (an operation in INPUT_REQUIRED waits on one of these)."""

from __future__ import annotations

import uuid

from django.db.models import QuerySet

from ledger.models import InputRequest


def input_request_get(*, operation_id: uuid.UUID, input_round: int) -> InputRequest | None:
    return InputRequest.objects.filter(operation_id=operation_id, round=input_round).first()


def input_requests_open() -> QuerySet[InputRequest]:
    return InputRequest.objects.filter(status=InputRequest.Status.OPEN).select_related("operation")
