"""Request middleware: a request id on everything, body limits before any work, errors logged.

* `X-Request-ID`: taken from the request when it is a sane token (a proxy's id), else generated;
  bound to every structlog line of the request and returned on the response.
* A declared Content-Length over TOOLOPS_MAX_REQUEST_BYTES is refused (413) before the body is
  read or parsed. Django reads at most Content-Length bytes, so a body without one is read as
  empty; the API's parser caps what it reads as well (toolops/rest/parsers.py).
* Every response of status 400 or more is logged through structlog with the request id, the
  status and the error class; an unhandled exception is logged with its (redacted) traceback.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

import structlog
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from toolops.logging import get_logger

REQUEST_ID_HEADER = "X-Request-ID"
_SANE_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

logger = get_logger("toolops.http")


def request_id_for(request: HttpRequest) -> str:
    given = request.headers.get(REQUEST_ID_HEADER, "")
    return given if _SANE_ID.match(given) else uuid.uuid4().hex


def _declared_length(request: HttpRequest) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0


class RequestLimitsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = request_id_for(request)
        request.META["TOOLOPS_REQUEST_ID"] = request_id
        with structlog.contextvars.bound_contextvars(request_id=request_id):
            limit = int(settings.TOOLOPS_MAX_REQUEST_BYTES)
            length = _declared_length(request)
            if length > limit:
                response: HttpResponse = JsonResponse(
                    {"detail": f"request body of {length} bytes is over the {limit} byte limit",
                     "error": "RequestTooLarge"}, status=413)
            else:
                response = self.get_response(request)
            response[REQUEST_ID_HEADER] = request_id
            if response.status_code >= 400:
                self._log(request, response)
            return response

    def _log(self, request: HttpRequest, response: HttpResponse) -> None:
        data: Any = getattr(response, "data", None)
        error = data.get("error") if isinstance(data, dict) else None
        detail = data.get("detail") if isinstance(data, dict) else None
        log = logger.error if response.status_code >= 500 else logger.warning
        log("request refused" if response.status_code < 500 else "request failed",
            method=request.method, path=request.path, status=response.status_code,
            error=error, detail=str(detail)[:300] if detail is not None else None)

    def process_exception(self, request: HttpRequest, exception: Exception) -> None:
        logger.error("unhandled exception", method=request.method, path=request.path,
                     exc_info=exception)
