"""Map executor and ledger refusals to HTTP statuses; nothing a caller can send yields a 500."""

from __future__ import annotations

from typing import Any

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from ledger.errors import LedgerError
from toolops.errors import LedgerUnavailable, ServerNotFound, SubmissionKeyTaken, ToolopsError
from toolops.python_api import OperationNotVisible
from toolops.services.answer_checks import InputAnswerRefused
from toolops.services.cancel import CancelRefused
from toolops.services.idempotency import IdempotencyInProgress, IdempotencyMismatch
from toolops.services.permissions import PermissionRefused
from toolops.services.reconcile import AlreadyResolved, EvidenceRejected

# Most specific first: the first isinstance match decides.
STATUS_BY_ERROR: tuple[tuple[type[Exception], int], ...] = (
    (OperationNotVisible, status.HTTP_404_NOT_FOUND),
    (PermissionRefused, status.HTTP_403_FORBIDDEN),
    (EvidenceRejected, status.HTTP_422_UNPROCESSABLE_ENTITY),
    (IdempotencyMismatch, status.HTTP_422_UNPROCESSABLE_ENTITY),
    (IdempotencyInProgress, status.HTTP_409_CONFLICT),
    (SubmissionKeyTaken, status.HTTP_409_CONFLICT),
    # The row's state no longer allows it (already terminal, round answered, item resolved).
    (CancelRefused, status.HTTP_409_CONFLICT),
    (InputAnswerRefused, status.HTTP_409_CONFLICT),
    (AlreadyResolved, status.HTTP_409_CONFLICT),
    # The database was away: the caller retries with the same Idempotency-Key.
    (LedgerUnavailable, status.HTTP_503_SERVICE_UNAVAILABLE),
    (ServerNotFound, status.HTTP_400_BAD_REQUEST),
    (ToolopsError, status.HTTP_400_BAD_REQUEST),
    # A guarded write lost its race or the state table refused it: the state moved on.
    (LedgerError, status.HTTP_409_CONFLICT),
)


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    for cls, code in STATUS_BY_ERROR:
        if isinstance(exc, cls):
            body: dict[str, Any] = {"detail": str(exc), "error": type(exc).__name__}
            if isinstance(exc, EvidenceRejected):
                body["reasons"] = exc.reasons
            return Response(body, status=code)
    return exception_handler(exc, context)
