"""Shape A: the experimental core tasks of MCP 2025-11-25 (SEP-1686), over Streamable HTTP.

Facts this module relies on are in docs mcp-tasks.md sections 2, 4 and 5; the ones that
shape the code:
* tasks live inside one MCP session in both SDKs, so the session id is persisted by the
  caller and handed to every later adapter instance (one session for all workers);
* `-32602` means "unknown/expired/other session" everywhere, and "already terminal" only
  in answer to tasks/cancel;
* input requests are delivered once, on an open tasks/result stream. mcp 1.30 keeps
  serving every tasks/result request it received until the task ends (a client that only
  hangs up does not stop it) and hands later input requests to whichever of them dequeues
  first; one whose client went away drops them (round 2 of a two-round elicitation lost once
  the process that read round 1 exited). So a stream is held only for one bounded
  `read_input`, and released with `notifications/cancelled` for its request: the server
  stops that handler, and what it queues later waits for the next tasks/result, from any
  process. The release reads on until the stream ends, so nothing sent before the cancel
  took effect is lost (docs/conformance.md, "Input rounds across processes").
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
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
    InputWindow,
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
from adapters.jsonrpc import (
    SESSION_HEADER,
    JsonRpcClient,
    Message,
    MessageStream,
    RpcReply,
    StreamEnd,
    message_kind,
    validation_detail,
)
from adapters.mcp_tasks_2025_keys import SUBMISSION_KEY_META, SubmissionKeyResolution

PROTOCOL_VERSION = "2025-11-25"
VERSION_HEADER = "MCP-Protocol-Version"
RELATED_TASK_META = "io.modelcontextprotocol/related-task"
INPUT_METHODS = frozenset({"elicitation/create", "sampling/createMessage"})
# After the first input request, wait this long for siblings before handing the batch over.
INPUT_GRACE_S = 0.3
# After cancelling a held stream, read on this long for what the server sent before the cancel.
RELEASE_DRAIN_S = 1.0
# How long a stream's release waits for its cancel to be let out (QPS gate, 429/503): an unsent
# cancel can cost a whole input round (see `_send_release`), a few seconds of one thread cannot.
RELEASE_CANCEL_WAIT_S = 10.0
# The pause between two tries when the refusal named no time: one token interval at 20 QPS.
RELEASE_CANCEL_MIN_WAIT_S = 0.05
MAX_PAGES = 100  # tools/list and tasks/list: a server looping on cursors must not hang us
CLIENT_INFO = {"name": "toolops", "version": "1"}
# The gate answers form elicitations and sampling requests; URL elicitation is not offered.
CLIENT_CAPABILITIES: dict[str, Any] = {"elicitation": {"form": {}}, "sampling": {}}

M = TypeVar("M", bound=pydantic.BaseModel)

# (endpoint, session, task) -> its open tasks/result stream; see the module docstring.
_INPUT_STREAMS: dict[tuple[str, str | None, str], MessageStream] = {}
_INPUT_STREAMS_LOCK = threading.Lock()


def close_input_streams() -> None:
    """Close every input stream this process holds open (worker shutdown, tests)."""
    with _INPUT_STREAMS_LOCK:
        streams = list(_INPUT_STREAMS.values())
        _INPUT_STREAMS.clear()
    for stream in streams:
        stream.close()


def _validate(model: type[M], data: Any, *, what: str) -> M:
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ProtocolViolationError(
            f"{what} does not match the 2025-11-25 schema", detail=validation_detail(exc)
        ) from exc


def _related_task_id(container: dict[str, Any] | None) -> str | None:
    meta = (container or {}).get("_meta")
    related = meta.get(RELATED_TASK_META) if isinstance(meta, dict) else None
    task_id = related.get("taskId") if isinstance(related, dict) else None
    return task_id if isinstance(task_id, str) else None


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


def _server_request(message: Message) -> ServerRequest:
    params = message.get("params") or {}
    if not isinstance(params, dict):
        raise ProtocolViolationError("server request params is not an object",
                                     detail={"method": decode.quote(message.get("method"))})
    return ServerRequest(
        request_id=decode.server_request_id(message["id"]),
        method=message["method"],
        params=params,
        related_task_id=_related_task_id(params),
    )


class McpTasks2025Adapter(SubmissionKeyResolution):
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
        related = _related_task_id(result)
        if remote_id is not None and related is not None and related != remote_id:
            decode.expect_same_task(asked=remote_id, got=related, what="task's result")
        if allow_empty and not any(k != "_meta" for k in result):
            # mcp 1.30 answers tasks/result of a failed or cancelled task with `_meta` only.
            return FetchedResult(kind="empty", payload=result, is_error=False, raw=message)
        parsed = _validate(wire.CallToolResult, result, what="tool result")
        return FetchedResult(kind="result", payload=result, is_error=bool(parsed.is_error), raw=message)

    def _error_result(self, reply: RpcReply) -> FetchedResult:
        return FetchedResult(kind="error", payload=dict(reply.error or {}), is_error=True, raw=reply.message)

    def _keep_server_messages(self, messages: tuple[Message, ...] | list[Message]) -> None:
        for message in messages:
            if message_kind(message) == "request":
                self.pending_server_requests.append(_server_request(message))
                # A server may send requests without end: keep the newest, bounded.
                del self.pending_server_requests[: -limits.MAX_PENDING_SERVER_REQUESTS]
            else:
                self.notifications.append(message)

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

    def read_input(self, *, remote_id: str, wait_s: float) -> InputWindow:
        deadline = time.monotonic() + wait_s
        collected = [r for r in self.pending_server_requests if self._is_input_for(r, remote_id)]
        self.pending_server_requests = [r for r in self.pending_server_requests if r not in collected]
        stream, fresh = self._input_stream(remote_id)
        result: FetchedResult | None = None
        try:
            result = self._read_window(stream, fresh=fresh, remote_id=remote_id,
                                       deadline=deadline, collected=collected)
        finally:
            self._release_stream(remote_id, collected=collected)
        return InputWindow(requests=tuple(collected), result=result)

    def _read_window(self, stream: MessageStream, *, fresh: bool, remote_id: str, deadline: float,
                     collected: list[ServerRequest]) -> FetchedResult | None:
        result: FetchedResult | None = None
        while (remaining := deadline - time.monotonic()) > 0:
            item = stream.next_item(timeout_s=min(remaining, INPUT_GRACE_S) if collected else remaining)
            if item is None:
                if collected:
                    break  # the grace passed without another request
                continue
            if isinstance(item, StreamEnd):
                self._drop_stream(remote_id, only=stream)
                if isinstance(item.error, LostResponseError) and not fresh and not collected:
                    # A stream kept from an earlier call died meanwhile (idle, restart): that is
                    # no news for this call, so open one new stream and keep waiting.
                    stream, fresh = self._input_stream(remote_id)
                    continue
                try:
                    result = self._stream_outcome(item, remote_id=remote_id)
                except AdapterError:
                    if not collected:
                        raise
                    # Hand over what was read; the stream is gone, the next read opens a new one.
                break
            self._route_stream_message(item, stream=stream, remote_id=remote_id, collected=collected)
        return result

    def _release_stream(self, remote_id: str, *, collected: list[ServerRequest]) -> None:
        """Stop holding the task's stream: cancel its request on the server, then read what
        the server sent before the cancel took effect, up to the end of the stream."""
        key = (self._rpc.url, self._session_id, remote_id)
        with _INPUT_STREAMS_LOCK:
            stream = _INPUT_STREAMS.pop(key, None)
        if stream is None or stream.finished:
            return
        cancelled = {"jsonrpc": "2.0", "method": "notifications/cancelled",
                     "params": {"requestId": stream.request_id, "reason": "input read window over"}}
        self._send_release(cancelled)
        drain_until = time.monotonic() + RELEASE_DRAIN_S
        while (remaining := drain_until - time.monotonic()) > 0:
            item = stream.next_item(timeout_s=remaining)
            if item is None or isinstance(item, StreamEnd):
                break
            self._route_stream_message(item, stream=stream, remote_id=remote_id, collected=collected)
        stream.close()

    def _send_release(self, cancelled: Message) -> None:
        """Send the stream's cancel, waiting out refusals that provably sent nothing (the QPS
        gate, a 429 or 503) up to RELEASE_CANCEL_WAIT_S. Both official SDKs keep serving a
        `tasks/result` whose request was never cancelled and hand it the task's next request,
        once, into a stream nobody reads any more: that round would never open anywhere."""
        give_up = time.monotonic() + RELEASE_CANCEL_WAIT_S
        while True:
            try:
                self._rpc.post_message(message=cancelled, what="notifications/cancelled")
                return
            except TransientError as exc:
                wait = min(max(exc.retry_after or 0.0, RELEASE_CANCEL_MIN_WAIT_S),
                           give_up - time.monotonic())
                if wait <= 0:
                    return
                time.sleep(wait)
            except AdapterError:
                # Refused or unreachable: nothing more to do here; nothing read is lost, the
                # drain below still reads what the stream holds.
                return

    @staticmethod
    def _is_input_for(request: ServerRequest, remote_id: str) -> bool:
        return request.method in INPUT_METHODS and request.related_task_id == remote_id

    def _route_stream_message(
        self, message: Message, *, stream: MessageStream, remote_id: str,
        collected: list[ServerRequest],
    ) -> None:
        if message_kind(message) != "request":
            self.notifications.append(message)
            return
        request = _server_request(message)
        if self._is_input_for(request, remote_id):
            # mcp 1.30 names a task's request `task-<task id>-<id(params)>`, and CPython reuses a
            # freed dict's address: round 2 may carry round 1's id. When the stream was opened
            # says whether the id can still be the old request (see ServerRequest).
            collected.append(dataclasses.replace(request, stream_opened_at=stream.opened_at))
            decode.input_request_count(len(collected), what="tasks/result input stream")
        else:
            self.pending_server_requests.append(request)
            del self.pending_server_requests[: -limits.MAX_PENDING_SERVER_REQUESTS]

    def _stream_outcome(self, end: StreamEnd, *, remote_id: str) -> FetchedResult:
        if end.error is not None:
            raise end.error
        assert end.reply is not None  # StreamEnd carries exactly one of the two
        return self._payload_outcome(end.reply, remote_id=remote_id)

    def answer_input(self, *, request_id: str | int, result: dict[str, Any], remote_id: str) -> None:
        meta = dict(result.get("_meta") or {})
        meta[RELATED_TASK_META] = {"taskId": remote_id}  # responses that belong to a task are tagged
        message = {"jsonrpc": "2.0", "id": request_id, "result": {**result, "_meta": meta}}
        self._rpc.post_message(message=message, what="input response")

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

    def _input_stream(self, remote_id: str) -> tuple[MessageStream, bool]:
        """The task's open tasks/result stream, and whether it was opened just now."""
        key = (self._rpc.url, self._session_id, remote_id)
        with _INPUT_STREAMS_LOCK:
            stream = _INPUT_STREAMS.get(key)
            if stream is not None and not stream.finished:
                return stream, False
            # Own client: the stream must survive this adapter's close().
            params = {"taskId": remote_id}
            stream = MessageStream(client=self._rpc.clone(), method="tasks/result", params=params).start()
            _INPUT_STREAMS[key] = stream
            return stream, True

    def _drop_stream(self, remote_id: str, *, only: MessageStream | None = None) -> None:
        """Forget (and close) the task's stream; with `only`, just if it is still that one."""
        key = (self._rpc.url, self._session_id, remote_id)
        with _INPUT_STREAMS_LOCK:
            stream = _INPUT_STREAMS.get(key)
            if stream is None or (only is not None and stream is not only):
                return
            del _INPUT_STREAMS[key]
        stream.close()

    def close(self) -> None:
        # Input streams stay open on purpose (module docstring); they end with their task.
        self._rpc.close()

    def __enter__(self) -> McpTasks2025Adapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
