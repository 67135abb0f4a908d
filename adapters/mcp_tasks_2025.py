"""Shape A: the experimental core tasks of MCP 2025-11-25 (SEP-1686), over Streamable HTTP.

Facts this module relies on are in docs mcp-tasks.md sections 2, 4 and 5; the ones that
shape the code:
* tasks live inside one MCP session in both SDKs, so the session id is persisted by the
  caller and handed to every later adapter instance (one session for all workers);
* `-32602` means "unknown/expired/other session" everywhere, and "already terminal" only
  in answer to tasks/cancel;
* input requests are delivered once, on an open tasks/result stream, held only for one
  bounded `read_input` (adapters/mcp_tasks_2025_inputs.py says why).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from typing import Any, TypeVar

import httpx
import pydantic
from mcp_types import _v2025_11_25 as wire
from mcp_types import jsonrpc as rpc

from adapters import decode, limits
from adapters.base import (
    FetchedResult,
    Negotiated,
    RemoteTask,
    RequestGate,
    ServerRequest,
    SubmitOutcome,
    ToolDescriptor,
    session_digest,
)
from adapters.errors import (
    AdapterError,
    AlreadyTerminalError,
    LostResponseError,
    NotFoundError,
    ProtocolViolationError,
    TaskNotSupportedError,
    TransientError,
)
from adapters.jsonrpc import SESSION_HEADER, JsonRpcClient
from adapters.jsonrpc_frames import Message, RpcReply, validation_detail
from adapters.mcp_tasks_2025_inputs import InputStreams, related_task_id
from adapters.mcp_tasks_2025_keys import SUBMISSION_KEY_META, SubmissionKeyResolution

PROTOCOL_VERSION = "2025-11-25"
VERSION_HEADER = "MCP-Protocol-Version"
MAX_PAGES = 100  # tools/list and tasks/list: a server looping on cursors must not hang us
CLIENT_INFO = {"name": "toolops", "version": "1"}
# The gate answers form elicitations and sampling requests; URL elicitation is not offered.
CLIENT_CAPABILITIES: dict[str, Any] = {"elicitation": {"form": {}}, "sampling": {}}

M = TypeVar("M", bound=pydantic.BaseModel)


def _validate(model: type[M], data: Any, *, what: str) -> M:
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ProtocolViolationError(
            f"{what} does not match the 2025-11-25 schema", detail=validation_detail(exc)
        ) from exc


STATUSES = frozenset({"working", "input_required", "completed", "failed", "cancelled"})


def _remote_task(data: dict[str, Any], *, model: type[wire.Task], expect_id: str | None) -> RemoteTask:
    task = _validate(model, data, what="task")
    remote_id = decode.task_id(task.task_id)
    if expect_id is not None:
        decode.expect_same_task(asked=expect_id, got=remote_id)
    decode.timestamp(task.last_updated_at, field="lastUpdatedAt", required=True)
    return RemoteTask(
        remote_id=remote_id,
        status=decode.status(task.status, allowed=STATUSES),
        status_message=decode.status_message(task.status_message),
        poll_interval_ms=decode.poll_interval_ms(task.poll_interval),
        ttl_ms=decode.ttl_ms(task.ttl),
        created_at=decode.timestamp(task.created_at, required=True),
        raw=data,
    )


def _rpc_error(
    reply: RpcReply,
    *,
    invalid_params: type[AdapterError] = AdapterError,
    method_not_found: type[AdapterError] = AdapterError,
    invalid_request: type[AdapterError] = AdapterError,
) -> AdapterError:
    """Classify a JSON-RPC error; the meaning of a code depends on the method (section 5.3)."""
    error = reply.error or {}
    code = error.get("code")
    detail = {
        "method": reply.method,
        "jsonrpc_code": code,
        "jsonrpc_message": str(error.get("message"))[:500],
        "http_status": reply.http_status,
    }
    text = f"{reply.method}: JSON-RPC error {code}: {detail['jsonrpc_message']}"
    if code == rpc.INTERNAL_ERROR:
        return TransientError(text, detail=detail)
    cls = {
        rpc.INVALID_PARAMS: invalid_params,
        rpc.METHOD_NOT_FOUND: method_not_found,
        rpc.INVALID_REQUEST: invalid_request,
    }.get(code if isinstance(code, int) else 0, AdapterError)
    return cls(text, detail=detail)


@contextlib.contextmanager
def _maybe_created(tool: str) -> Iterator[None]:
    """A tools/call reply we cannot read (garbled, foreign id, schema-invalid, oversized)
    still means the server got the call and may have created a task or run the tool.
    Report it as a lost response so it is reconciled, never resent as if nothing happened."""
    try:
        yield
    except ProtocolViolationError as exc:
        detail = {**exc.detail, "tool": tool, "protocol_violation": True}
        raise LostResponseError(f"tools/call: unreadable reply: {exc}", detail=detail) from exc


class McpTasks2025Adapter(InputStreams, SubmissionKeyResolution):
    version = "mcp-tasks/2025-11-25"
    # lookup_by_key is implemented; whether a server allows it is `key_resolution_modes`.
    capabilities: frozenset[str] = frozenset({"cancel", "list", "lookup_by_key"})

    def __init__(
        self,
        *,
        url: str,
        session_id: str | None = None,
        timeout_s: float = 30.0,
        max_response_bytes: int = limits.DEFAULT_MAX_RESPONSE_BYTES,
        transport: httpx.BaseTransport | None = None,
        request_deadline_s: float | None = None,
    ) -> None:
        self._rpc = JsonRpcClient(
            url=url, timeout_s=timeout_s, max_response_bytes=max_response_bytes, transport=transport,
            request_deadline_s=request_deadline_s,
        )
        self._session_id: str | None = None
        self._set_session(session_id)
        self._negotiated: Negotiated | None = None
        self._tools: dict[str, ToolDescriptor] = {}
        # Server requests that arrived on some stream but were not asked for yet.
        self.pending_server_requests: list[ServerRequest] = []
        self.notifications: deque[Message] = deque(maxlen=256)

    def set_request_gate(self, gate: RequestGate | None) -> None:
        self._rpc.request_gate = gate  # streams clone the client, and the gate with it

    # -- session -------------------------------------------------------------------------

    @property
    def session_id(self) -> str | None:
        return self._session_id

    @property
    def negotiated(self) -> Negotiated | None:
        return self._negotiated

    def _set_session(self, session_id: str | None) -> None:
        self._session_id = session_id
        self._rpc.headers.pop(SESSION_HEADER, None)
        if session_id:
            self._rpc.headers[SESSION_HEADER] = session_id
        self._rpc.headers[VERSION_HEADER] = PROTOCOL_VERSION

    def negotiate(self) -> Negotiated:
        # initialize always opens a new session; re-sending an old id would get a 404.
        self._rpc.headers.pop(SESSION_HEADER, None)
        self._rpc.headers.pop(VERSION_HEADER, None)
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": CLIENT_CAPABILITIES,
            "clientInfo": CLIENT_INFO,
        }
        try:
            reply = self._rpc.call(method="initialize", params=params)
        finally:
            self._set_session(self._session_id)
        if reply.error is not None:
            raise _rpc_error(reply)
        result = reply.result or {}
        init = _validate(wire.InitializeResult, result, what="initialize result")
        if init.protocol_version != PROTOCOL_VERSION:
            raise ProtocolViolationError(
                "server negotiated another protocol version",
                detail={"wanted": PROTOCOL_VERSION, "got": decode.quote(init.protocol_version)},
            )
        if reply.session_id is not None:
            decode.text(reply.session_id, field="Mcp-Session-Id", max_chars=limits.SESSION_ID_MAX_CHARS)
        self._set_session(reply.session_id)
        self._rpc.post_message(
            message={"jsonrpc": "2.0", "method": "notifications/initialized"},
            what="notifications/initialized",
        )
        tasks = init.capabilities.tasks
        requests = tasks.requests if tasks is not None else None
        self._negotiated = Negotiated(
            protocol_version=init.protocol_version,
            session_id=self._session_id,
            capabilities=dict(result.get("capabilities") or {}),
            server_info=dict(result.get("serverInfo") or {}),
            supports_task_tools_call=bool(requests and requests.tools and requests.tools.call is not None),
            supports_cancel=bool(tasks and tasks.cancel is not None),
            supports_list=bool(tasks and tasks.list is not None),
        )
        return self._negotiated

    # -- tools ---------------------------------------------------------------------------

    def _pages(
        self, *, method: str, key: str, what: str, model: type[pydantic.BaseModel]
    ) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(MAX_PAGES):
            reply = self._rpc.call(method=method, params={"cursor": cursor} if cursor else {})
            if reply.error is not None:
                raise _rpc_error(
                    reply, method_not_found=TaskNotSupportedError if method == "tasks/list" else AdapterError
                )
            result = reply.result or {}
            _validate(model, result, what=what)
            items.extend(result.get(key) or [])
            cursor = result.get("nextCursor")
            if not cursor:
                return items
            if cursor in seen:
                raise ProtocolViolationError(f"{method}: cursor repeats", detail={"method": method})
            seen.add(cursor)
        raise ProtocolViolationError(f"{method}: more than {MAX_PAGES} pages", detail={"method": method})

    def list_tools(self) -> list[ToolDescriptor]:
        raw_tools = self._pages(
            method="tools/list", key="tools", what="tools/list result", model=wire.ListToolsResult
        )
        tools = []
        for raw in raw_tools:
            tool = _validate(wire.Tool, raw, what="tool")
            support = (
                tool.execution.task_support if tool.execution and tool.execution.task_support else "forbidden"
            )
            tools.append(ToolDescriptor(name=tool.name, task_support=support, raw=raw))
        self._tools = {t.name: t for t in tools}
        return tools

    def _tool_result(self, message: Message, *, allow_empty: bool, remote_id: str | None) -> FetchedResult:
        result = message.get("result") or {}
        related = related_task_id(result)
        if remote_id is not None and related is not None and related != remote_id:
            decode.expect_same_task(asked=remote_id, got=related, what="task's result")
        if allow_empty and not any(k != "_meta" for k in result):
            # mcp 1.30 answers tasks/result of a failed or cancelled task with `_meta` only.
            return FetchedResult(kind="empty", payload=result, is_error=False, raw=message)
        parsed = _validate(wire.CallToolResult, result, what="tool result")
        return FetchedResult(kind="result", payload=result, is_error=bool(parsed.is_error), raw=message)

    def _error_result(self, reply: RpcReply) -> FetchedResult:
        return FetchedResult(kind="error", payload=dict(reply.error or {}), is_error=True, raw=reply.message)

    def submit(
        self, *, tool: str, arguments: dict[str, Any], ttl_ms: int | None, submission_key: str
    ) -> SubmitOutcome:
        # Refuse before sending when this instance already knows the answer: the spec says
        # the client MUST NOT send `task` without the capability or to a forbidden tool.
        if self._negotiated is not None and not self._negotiated.supports_task_tools_call:
            raise TaskNotSupportedError(
                "server does not offer task-augmented tools/call", detail={"tool": tool}
            )
        known = self._tools.get(tool)
        if known is not None and known.task_support == "forbidden":
            raise TaskNotSupportedError("tool does not support tasks", detail={"tool": tool})
        params = {
            "name": tool,
            "arguments": arguments,
            "task": {"ttl": ttl_ms} if ttl_ms is not None else {},
            "_meta": {SUBMISSION_KEY_META: submission_key},
        }
        try:
            with _maybe_created(tool):
                reply = self._rpc.call(method="tools/call", params=params, creates=True)
                self._keep_server_messages(reply.others)
                if reply.error is not None:
                    # Task-mode mismatch: -32601 MUST, -32600 MAY (the spec contradicts itself).
                    raise _rpc_error(
                        reply, method_not_found=TaskNotSupportedError,
                        invalid_request=TaskNotSupportedError,
                    )
                result = reply.result or {}
                if "task" in result:
                    # mcp-types types tools/call as CallToolResult only: parse the create reply here.
                    _validate(wire.CreateTaskResult, result, what="create-task result")
                    task = _remote_task(result["task"], model=wire.Task, expect_id=None)
                    return SubmitOutcome(task=task, sync_result=None, raw=result)
                sync = self._tool_result(reply.message, allow_empty=False, remote_id=None)
                return SubmitOutcome(task=None, sync_result=sync, raw=result)
        except LostResponseError as exc:
            # The session the request went out on decides whether a dedup resend is safe later.
            exc.detail["session"] = session_digest(self._session_id)
            raise

    def call_sync(
        self, *, tool: str, arguments: dict[str, Any], timeout_s: float, submission_key: str
    ) -> FetchedResult:
        params = {"name": tool, "arguments": arguments, "_meta": {SUBMISSION_KEY_META: submission_key}}
        with _maybe_created(tool):
            reply = self._rpc.call(method="tools/call", params=params, timeout_s=timeout_s, creates=True)
            self._keep_server_messages(reply.others)
            if reply.error is not None:
                if reply.error.get("code") == rpc.INTERNAL_ERROR:
                    raise _rpc_error(reply)
                return self._error_result(reply)  # the call's own outcome, as tools/call returned it
            return self._tool_result(reply.message, allow_empty=False, remote_id=None)

    # -- tasks ---------------------------------------------------------------------------

    def get(self, *, remote_id: str) -> RemoteTask:
        reply = self._rpc.call(method="tasks/get", params={"taskId": remote_id})
        self._keep_server_messages(reply.others)
        if reply.error is not None:
            raise _rpc_error(reply, invalid_params=NotFoundError, method_not_found=TaskNotSupportedError)
        return _remote_task(reply.result or {}, model=wire.GetTaskResult, expect_id=remote_id)

    def _payload_outcome(self, reply: RpcReply, *, remote_id: str) -> FetchedResult:
        if reply.error is not None:
            code = reply.error.get("code")
            if code in (rpc.INVALID_PARAMS, rpc.INTERNAL_ERROR, rpc.METHOD_NOT_FOUND):
                raise _rpc_error(reply, invalid_params=NotFoundError, method_not_found=TaskNotSupportedError)
            return self._error_result(reply)  # the JSON-RPC error that ended the task
        return self._tool_result(reply.message, allow_empty=True, remote_id=remote_id)

    def fetch_result(self, *, remote_id: str, timeout_s: float) -> FetchedResult:
        self._drop_stream(remote_id)  # the task is terminal: its input stream has no more use
        # The task is terminal: its result is a read like any other, bounded by the request deadline.
        budget = min(timeout_s, self._rpc.request_deadline_s)
        reply = self._rpc.call(method="tasks/result", params={"taskId": remote_id}, timeout_s=budget)
        self._keep_server_messages(reply.others)
        return self._payload_outcome(reply, remote_id=remote_id)

    def cancel(self, *, remote_id: str) -> RemoteTask:
        reply = self._rpc.call(method="tasks/cancel", params={"taskId": remote_id})
        self._keep_server_messages(reply.others)
        if reply.error is not None:
            # -32602 is also "unknown id" here; the caller disambiguates with tasks/get.
            raise _rpc_error(
                reply, invalid_params=AlreadyTerminalError, method_not_found=TaskNotSupportedError
            )
        self._drop_stream(remote_id)
        return _remote_task(reply.result or {}, model=wire.CancelTaskResult, expect_id=remote_id)

    def list_tasks(self) -> list[RemoteTask]:
        raw_tasks = self._pages(
            method="tasks/list", key="tasks", what="tasks/list result", model=wire.ListTasksResult
        )
        return [_remote_task(raw, model=wire.Task, expect_id=None) for raw in raw_tasks]

    def close(self) -> None:
        # Input streams stay open on purpose (module docstring); they end with their task.
        self._rpc.close()

    def __enter__(self) -> McpTasks2025Adapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
