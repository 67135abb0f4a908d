"""AIP-151 operations and AIP-193 errors as they come off the wire, read into the adapter's
values (docs lro-shapes.md section 1): `done:false` is running; `done:true` carries exactly one of
`response` and `error`; an `error` with code 1 (CANCELLED) is a cancellation, any other code a
failure. Functions of what was read only: adapters.aip151 sends the requests.
"""

from __future__ import annotations

from typing import Any

import httpx

from adapters import decode
from adapters.base import FetchedResult, RemoteTask
from adapters.errors import ProtocolViolationError

CANCELLED = 1  # google.rpc.Code.CANCELLED
# google.rpc.Code names by number (google/rpc/code.proto), for operator-readable details.
RPC_CODES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


def status_name(response: httpx.Response) -> tuple[str, dict[str, Any]]:
    """The AIP-193 `status` of an error reply (falls back to the HTTP code's usual name)."""
    fallback = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                404: "NOT_FOUND", 409: "ABORTED", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED",
                500: "INTERNAL", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
    error: dict[str, Any] = {}
    try:
        parsed = decode.json_loads(response.content, what="error body")
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            error = parsed["error"]
    except ProtocolViolationError:
        pass
    status = error.get("status")
    name = decode.quote(status, limit=64) if isinstance(status, str) and status \
        else fallback.get(response.status_code, "UNKNOWN")
    reason = None
    details = error.get("details")
    for item in details if isinstance(details, list) else []:
        if isinstance(item, dict) and str(item.get("@type", "")).endswith("google.rpc.ErrorInfo"):
            reason = decode.quote(item.get("reason"), limit=128)
    return name, {"http_status": response.status_code, "status": name, "reason": reason,
                  "message": str(error.get("message", ""))[:500]}


def remote_task(data: Any, *, expect_name: str | None) -> RemoteTask:
    if not isinstance(data, dict):
        raise ProtocolViolationError("operation is not an object")
    name, done = decode.task_id(data.get("name"), field="name"), data.get("done", False)
    if expect_name is not None:
        decode.expect_same_task(asked=expect_name, got=name, what="operation")
    if not isinstance(done, bool):
        raise ProtocolViolationError("operation `done` is not a boolean", detail={"name": name})
    has_response, error = "response" in data, data.get("error")
    result: FetchedResult | None = None
    message: str | None = None
    if not done:
        if has_response or error is not None:
            raise ProtocolViolationError("running operation carries a result", detail={"name": name})
        status = "working"
    elif has_response == (error is not None):
        raise ProtocolViolationError("done operation must carry exactly one of response/error",
                                     detail={"name": name})
    elif has_response:
        response = data["response"]
        if not isinstance(response, dict):
            raise ProtocolViolationError("operation response is not an object", detail={"name": name})
        status = "completed"
        result = FetchedResult(kind="result", payload=response, is_error=False, raw=data)
    else:
        if not isinstance(error, dict) or not isinstance(error.get("code"), int):
            raise ProtocolViolationError("operation error is not a google.rpc.Status", detail={"name": name})
        text = error.get("message", "")
        message = decode.status_message(text if isinstance(text, str) else str(text)) \
            or RPC_CODES.get(error["code"], "")
        status = "cancelled" if error["code"] == CANCELLED else "failed"
        result = FetchedResult(kind="error", payload=error, is_error=True, raw=data)
    metadata = data.get("metadata")
    return RemoteTask(
        remote_id=name, status=status, status_message=message, poll_interval_ms=None,
        ttl_ms=None, created_at=None, raw=data, result=result,
        progress=metadata if isinstance(metadata, dict) else None,
    )
