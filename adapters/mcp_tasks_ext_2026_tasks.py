"""A task of the `io.modelcontextprotocol/tasks` extension as `tasks/get` (or `tools/call`) returns
it, read into the adapter's values: its status, its inline outcome and its pending input requests
(docs mcp-tasks.md sections 3 to 5). Functions of what was read only: adapters.mcp_tasks_ext_2026
sends the requests.
"""

from __future__ import annotations

from typing import Any

from adapters import decode
from adapters.base import FetchedResult, RemoteTask, ServerRequest
from adapters.errors import ProtocolViolationError

TERMINAL = frozenset({"completed", "failed", "cancelled"})
STATUSES = frozenset({"working", "input_required"}) | TERMINAL
INPUT_METHODS = frozenset({"elicitation/create", "sampling/createMessage", "roots/list"})


def _inline_result(data: dict[str, Any]) -> FetchedResult | None:
    status = data.get("status")
    if status == "completed":
        result = data.get("result")
        if not isinstance(result, dict) or not isinstance(result.get("content"), list):
            raise ProtocolViolationError("completed task without a CallToolResult",
                                         detail={"taskId": data.get("taskId")})
        # isError:true is a COMPLETED task in the extension (only JSON-RPC errors fail).
        return FetchedResult(kind="result", payload=result, is_error=bool(result.get("isError")),
                             raw=data)
    if status == "failed":
        error = data.get("error")
        if not isinstance(error, dict) or not isinstance(error.get("code"), int):
            raise ProtocolViolationError("failed task without an error object",
                                         detail={"taskId": data.get("taskId")})
        return FetchedResult(kind="error", payload=error, is_error=True, raw=data)
    return None


def _input_requests(data: dict[str, Any], *, remote_id: str) -> tuple[ServerRequest, ...]:
    raw = data.get("inputRequests")
    if data.get("status") != "input_required" or raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ProtocolViolationError("inputRequests is not an object", detail={"taskId": remote_id})
    decode.input_request_count(len(raw), what="inputRequests")
    requests = []
    for key, request in sorted(raw.items()):
        if not isinstance(request, dict) or request.get("method") not in INPUT_METHODS:
            raise ProtocolViolationError("input request of an unknown kind",
                                         detail={"taskId": remote_id, "key": str(key)[:200]})
        if not isinstance(request.get("params", {}), dict):
            raise ProtocolViolationError("input request params is not an object",
                                         detail={"taskId": remote_id})
        requests.append(ServerRequest(request_id=decode.server_request_id(str(key)), method=request["method"],
                                      params=dict(request.get("params") or {}),
                                      related_task_id=remote_id))
    return tuple(requests)


def remote_task(data: Any, *, expect_id: str | None) -> RemoteTask:
    if not isinstance(data, dict):
        raise ProtocolViolationError("task is not an object")
    task_id = decode.task_id(data.get("taskId"))
    if expect_id is not None:
        decode.expect_same_task(asked=expect_id, got=task_id)
    status = decode.status(data.get("status"), allowed=STATUSES)
    if data.get("inputRequests") and ("result" in data or "error" in data):
        # Waiting for input and finished at once: neither reading can be trusted.
        raise ProtocolViolationError("input requests and an outcome in one task",
                                     detail={"taskId": task_id, "status": status})
    return RemoteTask(
        remote_id=task_id,
        status=status,
        status_message=decode.status_message(data.get("statusMessage")),
        poll_interval_ms=decode.poll_interval_ms(data.get("pollIntervalMs"), field="pollIntervalMs"),
        ttl_ms=decode.ttl_ms(data.get("ttlMs"), field="ttlMs"),
        created_at=decode.timestamp(data.get("createdAt")),
        raw=data,
        result=_inline_result(data),
        input_requests=_input_requests(data, remote_id=task_id),
    )
