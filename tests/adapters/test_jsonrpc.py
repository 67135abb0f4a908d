"""Parser and error-mapping faults of the Streamable HTTP JSON-RPC transport.

These are the cases a well-behaved SDK server will not produce on demand (truncated
streams, wrong ids, oversized bodies, 429s), so they run against httpx.MockTransport.
Behaviour against a real server is in test_mcp_tasks_2025.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from adapters import (
    ADAPTER_VERSIONS,
    AdapterError,
    AlreadyTerminalError,
    LostResponseError,
    McpTasks2025Adapter,
    NotFoundError,
    ProtocolViolationError,
    SessionLostError,
    TaskAdapter,
    TaskNotSupportedError,
    TransientError,
    adapter_for,
)
from adapters.mcp_tasks_2025_inputs import close_input_streams

URL = "http://peer.test/mcp"
SID = "session-1"
TASK_ID = "t-1"
TASK = {
    "taskId": TASK_ID,
    "status": "working",
    "createdAt": "2026-01-01T00:00:00Z",
    "lastUpdatedAt": "2026-01-01T00:00:00Z",
    "ttl": 60000,
    "pollInterval": 500,
}
RELATED = {"io.modelcontextprotocol/related-task": {"taskId": TASK_ID}}


@pytest.fixture(autouse=True)
def _fresh_adapters() -> Iterator[None]:
    """Overrides the repo-wide fixture of this name: these tests need no Django.
    Input streams are process-wide by design; drop them so tests stay independent."""
    yield
    close_input_streams()


Handler = Callable[[dict[str, Any], httpx.Request], httpx.Response]


class FakePeer:
    """Records every POST and answers through a per-test handler."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[tuple[dict[str, Any], httpx.Request]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append((body, request))
        return self.handler(body, request)

    @property
    def methods(self) -> list[str]:
        return [b.get("method", "<response>") for b, _ in self.requests]


def sse(*messages: dict[str, Any] | str) -> bytes:
    """One `event: message` per dict; strings are written verbatim (comments, junk)."""
    out = []
    for m in messages:
        out.append(m if isinstance(m, str) else f"event: message\ndata: {json.dumps(m)}\n\n")
    return "".join(out).encode()


def sse_response(*messages: dict[str, Any] | str, status: int = 200) -> httpx.Response:
    return httpx.Response(status, headers={"content-type": "text/event-stream"}, content=sse(*messages))


def ok(body: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": body["id"], "result": result}


def err(body: dict[str, Any], code: int, message: str = "nope") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": body["id"], "error": {"code": code, "message": message}}


def make(
    handler: Handler, *, session_id: str | None = SID, **kw: Any
) -> tuple[McpTasks2025Adapter, FakePeer]:
    peer = FakePeer(handler)
    adapter = McpTasks2025Adapter(url=URL, session_id=session_id, transport=httpx.MockTransport(peer), **kw)
    return adapter, peer


# -- SSE and JSON framing ------------------------------------------------------------------


def test_json_reply_is_parsed_and_validated() -> None:
    adapter, peer = make(lambda b, r: httpx.Response(200, json=ok(b, TASK)))
    task = adapter.get(remote_id=TASK_ID)
    assert (task.remote_id, task.status, task.poll_interval_ms, task.ttl_ms) == (
        TASK_ID,
        "working",
        500,
        60000,
    )
    assert task.raw == TASK


def test_sse_reply_picks_our_response_and_keeps_server_messages() -> None:
    elicit = {
        "jsonrpc": "2.0",
        "id": "task-x-1",
        "method": "elicitation/create",
        "params": {"mode": "form", "message": "?", "requestedSchema": {}, "_meta": RELATED},
    }
    note = {"jsonrpc": "2.0", "method": "notifications/tasks/status", "params": TASK}
    adapter, _ = make(lambda b, r: sse_response(": keepalive\n\n", note, elicit, ok(b, TASK)))
    assert adapter.get(remote_id=TASK_ID).status == "working"
    assert [r.request_id for r in adapter.pending_server_requests] == ["task-x-1"]
    assert adapter.pending_server_requests[0].related_task_id == TASK_ID
    assert list(adapter.notifications) == [note]


def test_every_request_after_initialize_carries_session_version_and_accept() -> None:
    def handler(body: dict[str, Any], request: httpx.Request) -> httpx.Response:
        if body.get("method") == "initialize":
            result = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tasks": {"cancel": {}, "requests": {"tools": {"call": {}}}}},
                "serverInfo": {"name": "fake", "version": "0"},
            }
            return httpx.Response(200, json=ok(body, result), headers={"Mcp-Session-Id": "new-session"})
        if "method" in body and "id" not in body:
            return httpx.Response(202)
        return httpx.Response(200, json=ok(body, TASK))

    adapter, peer = make(handler, session_id=None)
    negotiated = adapter.negotiate()
    assert negotiated.session_id == adapter.session_id == "new-session"
    assert (negotiated.supports_task_tools_call, negotiated.supports_cancel, negotiated.supports_list) == (
        True,
        True,
        False,
    )
    adapter.get(remote_id=TASK_ID)
    assert peer.methods == ["initialize", "notifications/initialized", "tasks/get"]
    init_request = peer.requests[0][1]
    assert "mcp-session-id" not in init_request.headers
    for _, request in peer.requests[1:]:
        assert request.headers["mcp-session-id"] == "new-session"
        assert request.headers["mcp-protocol-version"] == "2025-11-25"
        assert request.headers["accept"] == "application/json, text/event-stream"
    ids = [b["id"] for b, _ in peer.requests if "id" in b]
    assert all(isinstance(i, str) for i in ids) and len(set(ids)) == len(ids)


def test_negotiate_refuses_another_protocol_version() -> None:
    def handler(body: dict[str, Any], request: httpx.Request) -> httpx.Response:
        result = {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "serverInfo": {"name": "old", "version": "0"},
        }
        return httpx.Response(200, json=ok(body, result), headers={"Mcp-Session-Id": "s"})

    adapter, peer = make(handler, session_id=None)
    with pytest.raises(ProtocolViolationError):
        adapter.negotiate()
    assert peer.methods == ["initialize"]


# -- malformed replies -------------------------------------------------------------------


@pytest.mark.parametrize(
    "respond",
    [
        lambda b: httpx.Response(
            200, headers={"content-type": "application/json"}, content=b'{"jsonrpc": "2.0", "id"'
        ),
        lambda b: sse_response('event: message\ndata: {"jsonrpc": \n\n'),
        lambda b: httpx.Response(200, json={"jsonrpc": "1.0", "id": b["id"], "result": TASK}),
        lambda b: httpx.Response(200, json={"jsonrpc": "2.0", "id": b["id"]}),
        lambda b: httpx.Response(200, json=[ok(b, TASK)]),
        lambda b: httpx.Response(200, headers={"content-type": "text/html"}, content=b"<html/>"),
        lambda b: httpx.Response(
            200, json={"jsonrpc": "2.0", "id": b["id"], "result": {**TASK, "status": "done"}}
        ),
        lambda b: httpx.Response(200, json=ok(b, {**TASK, "taskId": "someone-else"})),
    ],
    ids=["cut-json", "cut-sse-json", "jsonrpc-1.0", "no-result", "batch", "html", "bad-status", "other-task"],
)
def test_malformed_or_foreign_replies_are_protocol_violations(
    respond: Callable[[dict[str, Any]], Any],
) -> None:
    adapter, _ = make(lambda b, r: respond(b))
    with pytest.raises(ProtocolViolationError):
        adapter.get(remote_id=TASK_ID)


@pytest.mark.parametrize(
    "result",
    [{"task": {"taskId": 7}}, {"task": {**TASK, "status": "queued"}}, {"content": "text"}],
    ids=["bad-task-id", "bad-status", "bad-call-result"],
)
def test_unreadable_tools_call_reply_is_a_lost_response(result: dict[str, Any]) -> None:
    # The server got the call: the executor must treat it as "maybe created", not "refused".
    adapter, _ = make(lambda b, r: sse_response(ok(b, result)))
    with pytest.raises(LostResponseError) as info:
        adapter.submit(tool="t", arguments={}, ttl_ms=None, submission_key="k")
    assert isinstance(info.value.__cause__, ProtocolViolationError)
    assert info.value.detail["protocol_violation"] is True
    with pytest.raises(LostResponseError):
        adapter.call_sync(tool="t", arguments={}, timeout_s=1.0, submission_key="k")


@pytest.mark.parametrize("framing", ["json", "sse"])
def test_response_with_another_id_is_a_protocol_violation(framing: str) -> None:
    def handler(body: dict[str, Any], request: httpx.Request) -> httpx.Response:
        wrong = {"jsonrpc": "2.0", "id": body["id"] + "-not", "result": TASK}
        return httpx.Response(200, json=wrong) if framing == "json" else sse_response(wrong)

    adapter, _ = make(handler)
    with pytest.raises(ProtocolViolationError) as info:
        adapter.get(remote_id=TASK_ID)
    assert "another JSON-RPC id" in str(info.value)


def test_oversized_bodies_are_refused() -> None:
    big = {"pad": "x" * 5000}
    adapter, _ = make(
        lambda b, r: httpx.Response(200, json=ok(b, {**TASK, "_meta": big})), max_response_bytes=1000
    )
    with pytest.raises(ProtocolViolationError, match="size limit"):
        adapter.get(remote_id=TASK_ID)

    def chunked(body: dict[str, Any], request: httpx.Request) -> httpx.Response:
        data = sse(ok(body, {**TASK, "_meta": big}))
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            stream=httpx.ByteStream(data),  # no content-length: the limit is counted while reading
        )

    adapter, _ = make(chunked, max_response_bytes=1000)
    with pytest.raises(ProtocolViolationError, match="size limit"):
        adapter.get(remote_id=TASK_ID)


@pytest.mark.parametrize(
    "tail",
    ["", 'event: message\ndata: {"jsonrpc":"2.0","id":"X","result":{}}'],  # clean EOF; event never terminated
    ids=["eof-before-response", "unterminated-event"],
)
def test_truncated_sse_is_a_lost_response(tail: str) -> None:
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {}}
    adapter, _ = make(lambda b, r: sse_response(note, tail))
    with pytest.raises(LostResponseError):
        adapter.get(remote_id=TASK_ID)
    with pytest.raises(LostResponseError):  # tools/call: "maybe created", never Transient
        adapter.submit(tool="t", arguments={}, ttl_ms=None, submission_key="k")


# -- HTTP status and transport failures --------------------------------------------------


def test_429_carries_retry_after_seconds_and_http_date() -> None:
    adapter, _ = make(lambda b, r: httpx.Response(429, headers={"Retry-After": "7"}))
    with pytest.raises(TransientError) as info:
        adapter.get(remote_id=TASK_ID)
    assert info.value.retry_after == 7.0
    assert info.value.detail["http_status"] == 429

    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    adapter, _ = make(lambda b, r: httpx.Response(503, headers={"Retry-After": when}))
    with pytest.raises(TransientError) as info:
        adapter.submit(tool="t", arguments={}, ttl_ms=1000, submission_key="k")
    assert info.value.retry_after is not None and 20 < info.value.retry_after <= 30


def test_5xx_without_body_is_transient_for_reads_but_lost_for_submissions() -> None:
    adapter, _ = make(lambda b, r: httpx.Response(502, text="bad gateway"))
    with pytest.raises(TransientError):
        adapter.get(remote_id=TASK_ID)
    with pytest.raises(LostResponseError):
        adapter.submit(tool="t", arguments={}, ttl_ms=None, submission_key="k")
    with pytest.raises(LostResponseError):
        adapter.call_sync(tool="t", arguments={}, timeout_s=1.0, submission_key="k")


def test_404_on_a_session_is_session_lost() -> None:
    body404 = {
        "jsonrpc": "2.0",
        "id": "server-error",
        "error": {"code": -32600, "message": "Session not found"},
    }
    adapter, _ = make(lambda b, r: httpx.Response(404, json=body404))
    with pytest.raises(SessionLostError) as info:
        adapter.get(remote_id=TASK_ID)
    assert isinstance(info.value, NotFoundError)
    assert info.value.detail["jsonrpc_code"] == -32600
    with pytest.raises(SessionLostError):
        adapter.answer_input(request_id="r1", result={"action": "accept"}, remote_id=TASK_ID)
    # Without a session a 404 means something else (wrong URL): not "session lost".
    adapter, _ = make(lambda b, r: httpx.Response(404, text="no such page"), session_id=None)
    with pytest.raises(AdapterError) as plain:
        adapter.get(remote_id=TASK_ID)
    assert not isinstance(plain.value, NotFoundError)


def test_http_error_with_json_rpc_body_is_classified_by_code() -> None:
    # mcp 1.30 answers some HTTP-level errors with id "server-error"; the code still counts.
    body = {"jsonrpc": "2.0", "id": "server-error", "error": {"code": -32602, "message": "Task not found"}}
    adapter, _ = make(lambda b, r: httpx.Response(400, json=body))
    with pytest.raises(NotFoundError):
        adapter.get(remote_id=TASK_ID)


@pytest.mark.parametrize(
    ("exc", "submit_error", "read_error"),
    [
        (httpx.ConnectError("refused"), TransientError, TransientError),
        (httpx.ConnectTimeout("slow"), TransientError, TransientError),
        (httpx.ReadTimeout("no answer"), LostResponseError, LostResponseError),
        (httpx.RemoteProtocolError("Server disconnected"), LostResponseError, LostResponseError),
        (httpx.WriteError("broken pipe"), LostResponseError, LostResponseError),
    ],
)
def test_transport_failures(
    exc: Exception, submit_error: type[Exception], read_error: type[Exception]
) -> None:
    def handler(body: dict[str, Any], request: httpx.Request) -> httpx.Response:
        raise exc

    adapter, _ = make(handler)
    with pytest.raises(submit_error):
        adapter.submit(tool="t", arguments={}, ttl_ms=None, submission_key="k")
    with pytest.raises(read_error):
        adapter.get(remote_id=TASK_ID)


# -- JSON-RPC error codes per method (mcp-tasks.md section 5) ------------------------------


@pytest.mark.parametrize(
    ("method", "code", "expected"),
    [
        ("get", -32602, NotFoundError),
        ("get", -32603, TransientError),
        ("get", -32601, TaskNotSupportedError),
        ("cancel", -32602, AlreadyTerminalError),
        ("cancel", -32603, TransientError),
        ("fetch_result", -32602, NotFoundError),
        ("submit", -32601, TaskNotSupportedError),
        ("submit", -32600, TaskNotSupportedError),
        ("submit", -32603, TransientError),
        ("submit", -32602, AdapterError),
        ("list_tasks", -32601, TaskNotSupportedError),
    ],
)
def test_json_rpc_error_codes(method: str, code: int, expected: type[AdapterError]) -> None:
    adapter, _ = make(lambda b, r: sse_response(err(b, code)))
    calls: dict[str, Callable[[], Any]] = {
        "get": lambda: adapter.get(remote_id=TASK_ID),
        "cancel": lambda: adapter.cancel(remote_id=TASK_ID),
        "fetch_result": lambda: adapter.fetch_result(remote_id=TASK_ID, timeout_s=1.0),
        "submit": lambda: adapter.submit(tool="t", arguments={}, ttl_ms=None, submission_key="k"),
        "list_tasks": lambda: adapter.list_tasks(),
    }
    with pytest.raises(expected) as info:
        calls[method]()
    assert type(info.value) is expected
    assert info.value.detail["jsonrpc_code"] == code


def test_other_json_rpc_errors_are_results_of_fetch_and_sync_calls() -> None:
    adapter, _ = make(lambda b, r: sse_response(err(b, -32000, "tool blew up")))
    fetched = adapter.fetch_result(remote_id=TASK_ID, timeout_s=1.0)
    assert (fetched.kind, fetched.is_error, fetched.payload["code"]) == ("error", True, -32000)
    synced = adapter.call_sync(tool="t", arguments={}, timeout_s=1.0, submission_key="k")
    assert synced.kind == "error" and synced.payload["message"] == "tool blew up"


# -- results -------------------------------------------------------------------------------


def test_fetch_result_kinds_and_task_binding() -> None:
    content = {"content": [{"type": "text", "text": "hi"}], "isError": False, "_meta": RELATED}
    adapter, _ = make(lambda b, r: sse_response(ok(b, content)))
    got = adapter.fetch_result(remote_id=TASK_ID, timeout_s=1.0)
    assert (got.kind, got.is_error, got.payload) == ("result", False, content)

    adapter, _ = make(lambda b, r: sse_response(ok(b, {"_meta": RELATED})))
    assert adapter.fetch_result(remote_id=TASK_ID, timeout_s=1.0).kind == "empty"

    foreign = {**content, "_meta": {"io.modelcontextprotocol/related-task": {"taskId": "t-2"}}}
    adapter, _ = make(lambda b, r: sse_response(ok(b, foreign)))
    with pytest.raises(ProtocolViolationError, match="another task"):
        adapter.fetch_result(remote_id=TASK_ID, timeout_s=1.0)

    adapter, _ = make(lambda b, r: sse_response(ok(b, {"content": "not-a-list"})))
    with pytest.raises(ProtocolViolationError):
        adapter.fetch_result(remote_id=TASK_ID, timeout_s=1.0)


def test_submit_sends_task_and_key_and_parses_both_reply_shapes() -> None:
    adapter, peer = make(lambda b, r: sse_response(ok(b, {"task": TASK})))
    outcome = adapter.submit(tool="render", arguments={"n": 3}, ttl_ms=60000, submission_key="key-1")
    assert outcome.task is not None and outcome.task.remote_id == TASK_ID and outcome.sync_result is None
    params = peer.requests[0][0]["params"]
    assert params == {
        "name": "render",
        "arguments": {"n": 3},
        "task": {"ttl": 60000},
        "_meta": {"io.toolops/submission-key": "key-1"},
    }
    sync = {"content": [{"type": "text", "text": "now"}], "isError": False}
    adapter, _ = make(lambda b, r: sse_response(ok(b, sync)))
    outcome = adapter.submit(tool="render", arguments={}, ttl_ms=None, submission_key="key-2")
    assert outcome.task is None and outcome.sync_result is not None and outcome.sync_result.payload == sync


def test_submit_refuses_a_forbidden_tool_without_sending() -> None:
    tools = {
        "tools": [
            {"name": "plain", "inputSchema": {"type": "object"}},
            {"name": "long", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "required"}},
        ]
    }
    adapter, peer = make(lambda b, r: sse_response(ok(b, tools)))
    assert [(t.name, t.task_support) for t in adapter.list_tools()] == [
        ("plain", "forbidden"),
        ("long", "required"),
    ]
    with pytest.raises(TaskNotSupportedError):
        adapter.submit(tool="plain", arguments={}, ttl_ms=None, submission_key="k")
    assert peer.methods == ["tools/list"]


def test_list_tasks_follows_cursors_and_refuses_a_loop() -> None:
    def pages(body: dict[str, Any], request: httpx.Request) -> httpx.Response:
        cursor = body["params"].get("cursor")
        page = {"tasks": [{**TASK, "taskId": f"t-{cursor or 0}"}]}
        return sse_response(ok(body, {**page, "nextCursor": "1"} if cursor is None else page))

    adapter, peer = make(pages)
    assert [t.remote_id for t in adapter.list_tasks()] == ["t-0", "t-1"]
    assert [b["params"] for b, _ in peer.requests] == [{}, {"cursor": "1"}]

    adapter, _ = make(lambda b, r: sse_response(ok(b, {"tasks": [], "nextCursor": "same"})))
    with pytest.raises(ProtocolViolationError, match="cursor repeats"):
        adapter.list_tasks()


def test_answer_input_posts_a_tagged_response() -> None:
    adapter, peer = make(lambda b, r: httpx.Response(202))
    adapter.answer_input(
        request_id=5, result={"action": "accept", "content": {"value": "x"}}, remote_id=TASK_ID
    )
    body = peer.requests[0][0]
    assert body == {
        "jsonrpc": "2.0",
        "id": 5,
        "result": {"action": "accept", "content": {"value": "x"}, "_meta": RELATED},
    }


# -- read_input bounds ---------------------------------------------------------------------


class SlowStream(httpx.SyncByteStream):
    """An SSE body that yields events with pauses, then idles until released (or ends)."""

    def __init__(
        self, steps: list[tuple[float, bytes]], release: threading.Event, *, idle: bool = True
    ) -> None:
        self.steps = steps
        self.release = release
        self.idle = idle

    def __iter__(self) -> Iterator[bytes]:
        for pause, chunk in self.steps:
            if self.release.wait(pause):
                return
            yield chunk
        if self.idle:
            self.release.wait(30)


def _elicit(request_id: str, task_id: str = TASK_ID) -> dict[str, Any]:
    meta = {"io.modelcontextprotocol/related-task": {"taskId": task_id}}
    params = {"mode": "form", "message": "?", "requestedSchema": {}, "_meta": meta}
    return {"jsonrpc": "2.0", "id": request_id, "method": "elicitation/create", "params": params}


def test_read_input_returns_after_a_short_grace_and_never_past_wait_s() -> None:
    releases: list[threading.Event] = []
    cancelled: list[Any] = []
    steps = [
        (0.05, sse(_elicit("e1"))),
        (0.05, sse(_elicit("e9", task_id="other"))),
        (0.05, sse(_elicit("e2"))),
    ]

    def handler(body: dict[str, Any], request: httpx.Request) -> httpx.Response:
        if body.get("method") == "notifications/cancelled":
            # As the SDK server does: the cancelled request's stream ends.
            cancelled.append(body["params"]["requestId"])
            releases[-1].set()
            return httpx.Response(202)
        releases.append(threading.Event())
        stream = SlowStream(steps if len(releases) == 1 else [], releases[-1])
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)

    adapter, _ = make(handler)
    try:
        started = time.monotonic()
        window = adapter.read_input(remote_id=TASK_ID, wait_s=5.0)
        elapsed = time.monotonic() - started
        assert [r.request_id for r in window.requests] == ["e1", "e2"] and window.result is None
        assert elapsed < 1.5  # returned after the grace, not after wait_s
        assert [r.request_id for r in adapter.pending_server_requests] == ["e9"]  # other task: kept aside
        assert len(cancelled) == 1  # the stream was released on the server, not just dropped
        started = time.monotonic()
        window = adapter.read_input(remote_id=TASK_ID, wait_s=0.5)  # a new stream, silent
        assert window.requests == () and 0.4 < time.monotonic() - started < 2.0
        assert len(releases) == 2 and len(cancelled) == 2
    finally:
        for release in releases:
            release.set()
        adapter.close()


def test_read_input_release_keeps_what_the_server_sent_before_the_cancel() -> None:
    """A request the server put on the stream just before it saw our cancel is still read: it
    was dequeued on the server and exists nowhere else."""
    release = threading.Event()
    late = threading.Event()

    class LateStream(httpx.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            yield sse(_elicit("e1"))
            late.wait(5)
            yield sse(_elicit("e2"))  # sent while our cancel was on its way
            release.wait(5)

    def handler(body: dict[str, Any], request: httpx.Request) -> httpx.Response:
        if body.get("method") == "notifications/cancelled":
            late.set()
            return httpx.Response(202)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=LateStream())

    adapter, _ = make(handler)
    try:
        window = adapter.read_input(remote_id=TASK_ID, wait_s=2.0)
        assert [r.request_id for r in window.requests] == ["e1", "e2"]
    finally:
        release.set()


def test_read_input_raises_when_a_new_stream_fails() -> None:
    adapter, _ = make(lambda b, r: sse_response(err(b, -32602, "Task not found")))
    with pytest.raises(NotFoundError):
        adapter.read_input(remote_id=TASK_ID, wait_s=2.0)


def test_a_reply_trickling_keepalives_cannot_outlive_the_call_budget() -> None:
    release = threading.Event()
    pings = [(0.1, b": keepalive\n\n")] * 50

    def handler(body: dict[str, Any], request: httpx.Request) -> httpx.Response:
        stream = SlowStream(pings, release, idle=False)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)

    adapter, _ = make(handler)
    started = time.monotonic()
    try:
        with pytest.raises(LostResponseError, match="request deadline"):
            adapter.call_sync(tool="t", arguments={}, timeout_s=0.5, submission_key="k")
        assert time.monotonic() - started < 1.5
    finally:
        release.set()


def test_read_input_returns_the_final_response() -> None:
    def handler(body: dict[str, Any], request: httpx.Request) -> httpx.Response:
        final = ok(body, {"content": [{"type": "text", "text": "done"}], "_meta": RELATED})
        return sse_response(_elicit("e1"), final)

    adapter, _ = make(handler)
    window = adapter.read_input(remote_id=TASK_ID, wait_s=5.0)
    assert [r.request_id for r in window.requests] == ["e1"]
    assert window.result is not None and window.result.kind == "result"


# -- registry ------------------------------------------------------------------------------


def test_registry() -> None:
    assert ADAPTER_VERSIONS == ("mcp-tasks/2025-11-25", "mcp-tasks-ext/2026-07-28", "aip-151/v1")
    adapter = adapter_for(version="mcp-tasks/2025-11-25", url=URL, session_id=SID)
    assert isinstance(adapter, McpTasks2025Adapter) and isinstance(adapter, TaskAdapter)
    assert adapter.session_id == SID
    adapter.close()
    with pytest.raises(ValueError, match="unknown adapter version 'azure-lro/v1'"):
        adapter_for(version="azure-lro/v1", url=URL, session_id=None)
