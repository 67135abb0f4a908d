"""Shape B: the `io.modelcontextprotocol/tasks` extension (SEP-2663) on MCP 2026-07-28.

Facts this module relies on (docs mcp-tasks.md sections 3 to 5):
* no initialize and no session: every request carries `_meta` with the protocol version and
  the client capabilities, and the extension is declared on EACH request where we accept a
  task ("servers MUST NOT infer capabilities from prior requests");
* the server decides whether `tools/call` becomes a task, so a synchronous result is a
  normal answer to `submit`;
* `tasks/get` carries the outcome inline (`result` / `error`) and pending `inputRequests`;
  `tasks/update {inputResponses}` answers input; `tasks/cancel` is only an ack;
* dispatch on `status`, never on `resultType` (the spec's own examples disagree);
* `-32602` = unknown, expired or purged id; `-32021` (drafts: `-32003`) = a capability the
  client did not declare; HTTP 400/404 carry ordinary JSON-RPC errors here, so the body is
  read before the status (section 5 point 12).
"""

from __future__ import annotations

import base64
import threading
from collections import OrderedDict, deque
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import httpx
from mcp_types import jsonrpc as rpc

from adapters import limits
from adapters.base import (
    FetchedResult,
    InputWindow,
    Negotiated,
    RemoteTask,
    RequestGate,
    ResendRequest,
    SubmitOutcome,
    ToolDescriptor,
)
from adapters.errors import (
    AdapterError,
    NotFoundError,
    ProtocolViolationError,
    TaskNotSupportedError,
    TransientError,
)
from adapters.jsonrpc import JsonRpcClient
from adapters.jsonrpc_frames import Message, RpcReply, message_kind
from adapters.mcp_tasks_ext_2026_tasks import remote_task

PROTOCOL_VERSION = "2026-07-28"
EXTENSION = "io.modelcontextprotocol/tasks"
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
SUBMISSION_KEY_META = "io.toolops/submission-key"
CLIENT_INFO = {"name": "toolops", "version": "1"}
# -32021 is the released code for "capability not declared"; -32003 was the drafts' number
# and older servers still send it (spec PRs #2756, #3116).
MISSING_CAPABILITY_CODES = frozenset({-32021, -32003})
# Inline results kept for `fetch_result` right after the `get` that saw them; bounded because
# the adapter is cached per process and results of tasks nobody fetches must not pile up.
RESULT_CACHE_SIZE = 256


def _client_meta(*, with_tasks: bool) -> dict[str, Any]:
    capabilities: dict[str, Any] = {"elicitation": {"form": {}}, "sampling": {}}
    if with_tasks:
        capabilities["extensions"] = {EXTENSION: {}}
    return {
        META_VERSION: PROTOCOL_VERSION,
        META_CAPABILITIES: capabilities,
        META_CLIENT_INFO: CLIENT_INFO,
    }


def _header_value(value: str) -> str:
    """Mcp-Name: plain when ASCII-safe, else the `=?base64?...?=` sentinel (section 3.8)."""
    if value.isascii() and value.isprintable() and value.strip() == value:
        return value
    return "=?base64?" + base64.b64encode(value.encode()).decode() + "?="


class _RoutedClient(JsonRpcClient):
    """JsonRpcClient whose routing headers are per request.

    `Mcp-Method` / `Mcp-Name` differ on every request while one client is shared by
    threads, so they live in a thread-local for the duration of one call instead of in the
    shared `headers` dict.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._routing = threading.local()

    def _request_headers(self) -> dict[str, str]:
        return {**super()._request_headers(), **getattr(self._routing, "headers", {})}

    def routed_call(self, *, method: str, params: dict[str, Any], name: str | None,
                    timeout_s: float | None = None, creates: bool = False) -> RpcReply:
        headers = {"Mcp-Method": method}
        if name is not None:
            headers["Mcp-Name"] = _header_value(name)
        self._routing.headers = headers
        try:
            return self.call(method=method, params=params, timeout_s=timeout_s, creates=creates)
        finally:
            self._routing.headers = {}


def _rpc_error(reply: RpcReply, *, invalid_params: type[AdapterError] = AdapterError) -> AdapterError:
    error = reply.error or {}
    code = error.get("code")
    detail = {
        "method": reply.method,
        "jsonrpc_code": code,
        "jsonrpc_message": str(error.get("message"))[:500],
        "http_status": reply.http_status,
    }
    if isinstance(error.get("data"), dict) and "requiredCapabilities" in error["data"]:
        detail["required_capabilities"] = error["data"]["requiredCapabilities"]
    text = f"{reply.method}: JSON-RPC error {code}: {detail['jsonrpc_message']}"
    if code == rpc.INTERNAL_ERROR:
        return TransientError(text, detail=detail)
    if code in MISSING_CAPABILITY_CODES or code == rpc.METHOD_NOT_FOUND:
        # Missing declaration, or a server (or a 2025-11-25 connection) without the extension.
        return TaskNotSupportedError(text, detail=detail)
    if code == rpc.INVALID_PARAMS:
        return invalid_params(text, detail=detail)
    return AdapterError(text, detail=detail)


class McpTasksExt2026Adapter:
    version = "mcp-tasks-ext/2026-07-28"
    # inline_result: `get` carries the outcome; cancel_ack_only: see TaskAdapter.cancel;
    # inline_input: input requests arrive on `get` and repeat until answered.
    capabilities: frozenset[str] = frozenset({"cancel", "cancel_ack_only", "inline_result",
                                              "inline_input"})

    def __init__(
        self,
        *,
        url: str,
        session_id: str | None = None,  # the extension has no sessions; accepted and ignored
        timeout_s: float = 30.0,
        max_response_bytes: int = limits.DEFAULT_MAX_RESPONSE_BYTES,
        transport: httpx.BaseTransport | None = None,
        request_deadline_s: float | None = None,
    ) -> None:
        self._rpc = _RoutedClient(url=url, timeout_s=timeout_s, max_response_bytes=max_response_bytes,
                                  transport=transport, request_deadline_s=request_deadline_s)
        self._rpc.headers["MCP-Protocol-Version"] = PROTOCOL_VERSION
        self._negotiated: Negotiated | None = None
        self._results: OrderedDict[str, FetchedResult] = OrderedDict()
        self._results_lock = threading.Lock()
        # Keys this instance already answered, per task: a repeated inputRequests entry
        # whose answer is on its way is not handed out twice. Durable dedup (one round per
        # key) is the ledger's InputRequest unique constraint; this only saves a round trip.
        self._answered: dict[str, set[str]] = {}
        # Notifications a server pushed on a reply's stream (a `notifications/tasks/status` for
        # some task): the caller takes them as hints to poll sooner, never as a task's state.
        self.notifications: deque[Message] = deque(maxlen=256)

    @property
    def session_id(self) -> str | None:
        return None

    @property
    def negotiated(self) -> Negotiated | None:
        return self._negotiated

    def _call(self, *, method: str, params: dict[str, Any], name: str | None, with_tasks: bool = True,
              timeout_s: float | None = None, creates: bool = False) -> RpcReply:
        full = {**params, "_meta": {**params.get("_meta", {}), **_client_meta(with_tasks=with_tasks)}}
        reply = self._rpc.routed_call(method=method, params=full, name=name, timeout_s=timeout_s,
                                      creates=creates)
        self.notifications.extend(m for m in reply.others if message_kind(m) == "notification")
        return reply

    def negotiate(self) -> Negotiated:
        reply = self._call(method="server/discover", params={}, name=None)
        if reply.error is not None:
            raise _rpc_error(reply)
        result = reply.result or {}
        versions = result.get("supportedVersions")
        if not isinstance(versions, list) or PROTOCOL_VERSION not in versions:
            raise TaskNotSupportedError("server does not speak protocol 2026-07-28",
                                        detail={"supportedVersions": str(versions)[:200]})
        capabilities = result.get("capabilities")
        if not isinstance(capabilities, dict):
            raise ProtocolViolationError("server/discover without capabilities")
        extensions = capabilities.get("extensions")
        has_tasks = isinstance(extensions, dict) and EXTENSION in extensions
        meta = result.get("_meta") or {}
        self._negotiated = Negotiated(
            protocol_version=PROTOCOL_VERSION,
            session_id=None,
            capabilities=dict(capabilities),
            server_info=dict(meta.get("io.modelcontextprotocol/serverInfo") or {}),
            supports_task_tools_call=has_tasks,
            supports_cancel=has_tasks,
            supports_list=False,  # the extension has no tasks/list, by design
        )
        return self._negotiated

    def list_tools(self) -> list[ToolDescriptor]:
        tools: list[ToolDescriptor] = []
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(100):
            reply = self._call(method="tools/list", params={"cursor": cursor} if cursor else {}, name=None)
            if reply.error is not None:
                raise _rpc_error(reply)
            result = reply.result or {}
            for raw in result.get("tools") or []:
                if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
                    raise ProtocolViolationError("tools/list entry without a name")
                # No per-tool marker exists on 2026-07-28: the server decides per call, so
                # every tool of a server with the extension may become a task.
                support = "optional" if self._negotiated is None or \
                    self._negotiated.supports_task_tools_call else "forbidden"
                tools.append(ToolDescriptor(name=raw["name"], task_support=support, raw=raw))
            cursor = result.get("nextCursor")
            if not cursor:
                return tools
            if cursor in seen:
                raise ProtocolViolationError("tools/list: cursor repeats")
            seen.add(cursor)
        raise ProtocolViolationError("tools/list: more than 100 pages")

    def _call_result(self, reply: RpcReply) -> FetchedResult:
        result = reply.result or {}
        if not isinstance(result.get("content"), list):
            raise ProtocolViolationError("tools/call answer is neither a task nor a CallToolResult",
                                         detail={"resultType": str(result.get("resultType"))[:50]})
        return FetchedResult(kind="result", payload=result, is_error=bool(result.get("isError")),
                             raw=reply.message)

    def submit(
        self, *, tool: str, arguments: dict[str, Any], ttl_ms: int | None, submission_key: str
    ) -> SubmitOutcome:
        # ttl_ms is not sent: the extension has no client-side ttl (params.task is ignored).
        params = {"name": tool, "arguments": arguments, "_meta": {SUBMISSION_KEY_META: submission_key}}
        reply = self._call(method="tools/call", params=params, name=tool, creates=True)
        if reply.error is not None:
            raise _rpc_error(reply)
        result = reply.result or {}
        if "taskId" in result or result.get("resultType") == "task":
            # Flat CreateTaskResult. Durable creation: the server may not return it before
            # tasks/get resolves, so the id is safe to persist and poll right away.
            task = remote_task(result, expect_id=None)
            return SubmitOutcome(task=task, sync_result=None, raw=result)
        if result.get("resultType") == "input_required":
            # MRTR before a task exists: the same call must be retried with the answers.
            # toolops keeps input rounds on tasks only; refuse clearly instead of guessing.
            raise TaskNotSupportedError("server asked for input before creating a task (MRTR)",
                                        detail={"tool": tool})
        return SubmitOutcome(task=None, sync_result=self._call_result(reply), raw=result)

    def call_sync(
        self, *, tool: str, arguments: dict[str, Any], timeout_s: float, submission_key: str
    ) -> FetchedResult:
        # Without the declaration the server MUST NOT create a task (section 3.2).
        params = {"name": tool, "arguments": arguments, "_meta": {SUBMISSION_KEY_META: submission_key}}
        reply = self._call(method="tools/call", params=params, name=tool, with_tasks=False,
                           timeout_s=timeout_s, creates=True)
        if reply.error is not None:
            code = (reply.error or {}).get("code")
            if code == rpc.INTERNAL_ERROR or code in MISSING_CAPABILITY_CODES:
                raise _rpc_error(reply)
            return FetchedResult(kind="error", payload=dict(reply.error), is_error=True, raw=reply.message)
        return self._call_result(reply)

    def get(self, *, remote_id: str) -> RemoteTask:
        reply = self._call(method="tasks/get", params={"taskId": remote_id}, name=remote_id)
        if reply.error is not None:
            raise _rpc_error(reply, invalid_params=NotFoundError)
        task = remote_task(reply.result, expect_id=remote_id)
        if task.result is not None:
            with self._results_lock:
                self._results[remote_id] = task.result
                self._results.move_to_end(remote_id)
                while len(self._results) > RESULT_CACHE_SIZE:
                    self._results.popitem(last=False)
        return task

    def fetch_result(self, *, remote_id: str, timeout_s: float) -> FetchedResult:
        """The inline outcome of the last `get` that saw it; else one more `tasks/get`."""
        with self._results_lock:
            cached = self._results.pop(remote_id, None)
        self._answered.pop(remote_id, None)
        if cached is not None:
            return cached
        task = self.get(remote_id=remote_id)
        with self._results_lock:
            self._results.pop(remote_id, None)
        if task.result is None:
            raise ProtocolViolationError("task has no result to fetch",
                                         detail={"taskId": remote_id, "status": task.status})
        return task.result

    def read_input(self, *, remote_id: str, wait_s: float) -> InputWindow:
        """One `tasks/get`: pending input requests not yet answered here, or the outcome.

        Never waits: the extension repeats requests on every read, so nothing is lost by
        returning at once (`wait_s` exists for Shape A's live stream).
        """
        task = self.get(remote_id=remote_id)
        answered = self._answered.get(remote_id, set())
        requests = tuple(r for r in task.input_requests if str(r.request_id) not in answered)
        return InputWindow(requests=requests, result=task.result)

    def answer_input(self, *, request_id: str | int, result: dict[str, Any], remote_id: str) -> None:
        self.answer_inputs(responses={str(request_id): result}, remote_id=remote_id)

    def answer_inputs(self, *, responses: dict[str, dict[str, Any]], remote_id: str) -> None:
        """`tasks/update` with several keys at once (partial answers are allowed too).

        The ack is eventually consistent: the caller keeps polling. Resending a key is safe
        (answered keys are ignored by the server), so a lost ack is retried as is.
        """
        params = {"taskId": remote_id, "inputResponses": responses}
        reply = self._call(method="tasks/update", params=params, name=remote_id)
        if reply.error is not None:
            raise _rpc_error(reply, invalid_params=NotFoundError)
        self._answered.setdefault(remote_id, set()).update(responses)

    def cancel(self, *, remote_id: str) -> RemoteTask:
        """Send `tasks/cancel` (an ack only), then read the task: it may still be working.

        A cancel of a terminal task is acked without error by the spec; the following read
        shows the real terminal state, which the executor accepts as is.
        """
        reply = self._call(method="tasks/cancel", params={"taskId": remote_id}, name=remote_id)
        if reply.error is not None:
            raise _rpc_error(reply, invalid_params=NotFoundError)
        return self.get(remote_id=remote_id)

    def list_tasks(self) -> list[RemoteTask]:
        raise TaskNotSupportedError("the tasks extension has no tasks/list", detail={})

    def key_resolution_modes(self, *, server_capabilities: Mapping[str, Any]) -> frozenset[str]:
        # The extension has no tasks/list and no lookup by any client key (mcp-tasks.md section 5):
        # a lost create answer cannot be resolved automatically, only by an operator.
        return frozenset()

    def lookup_by_key(
        self,
        *,
        submission_key: str,
        created_after: datetime,
        server_capabilities: Mapping[str, Any] | None = None,
        submitted_session: str | None = None,
        resend: ResendRequest | None = None,
    ) -> RemoteTask | None:
        return None

    def candidates_by_window(
        self, *, created_after: datetime, created_before: datetime
    ) -> list[RemoteTask]:
        return []

    def set_request_gate(self, gate: RequestGate | None) -> None:
        self._rpc.request_gate = gate

    def close(self) -> None:
        self._rpc.close()

    def __enter__(self) -> McpTasksExt2026Adapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
