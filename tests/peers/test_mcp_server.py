"""Wire-level tests of the reference MCP peer (mcp 1.30 experimental tasks, Shape A).

Raw HTTP with httpx on purpose: these tests pin down what the SDK puts on the wire,
which is what the client executor has to cope with. No Django needed.
"""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpx
import pytest

from tests.peers.launch import peer_lookup, peer_reset, peer_stats, running_reference_server

PROTOCOL = "2025-11-25"
RELATED_TASK = "io.modelcontextprotocol/related-task"
SUBMISSION_KEY = "io.toolops/submission-key"
BASE_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def parse_sse(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Minimal SSE reader: yields the JSON of each event's joined `data:` lines.
    Comment lines (`: ping`) and `event:`/`id:`/`retry:` fields are skipped."""
    data: list[str] = []
    for line in itertools.chain(lines, [""]):
        if line == "":
            if data:
                yield json.loads("\n".join(data))
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))


class McpSession:
    """One MCP session over Streamable HTTP: initialize once, then JSON-RPC POSTs."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.Client(timeout=15.0)
        self.session_id: str | None = None
        self._ids = itertools.count(1)

    def close(self) -> None:
        self.client.close()

    @property
    def headers(self) -> dict[str, str]:
        assert self.session_id, "initialize first"
        return BASE_HEADERS | {"Mcp-Session-Id": self.session_id, "MCP-Protocol-Version": PROTOCOL}

    def initialize(self, capabilities: dict[str, Any] | None = None) -> dict[str, Any]:
        params = {
            "protocolVersion": PROTOCOL,
            # elicitation is required for ask_input: the SDK checks it before eliciting.
            "capabilities": {"elicitation": {}} if capabilities is None else capabilities,
            "clientInfo": {"name": "toolops-tests", "version": "0"},
        }
        request_id = next(self._ids)
        msg = {"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": params}
        response = self.client.post(self.url, headers=BASE_HEADERS, json=msg)
        assert response.status_code == 200, response.text
        self.session_id = response.headers["mcp-session-id"]
        result = self._only_reply(response, request_id)["result"]
        ack = self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert ack.status_code == 202
        return dict(result)

    def post(self, message: dict[str, Any]) -> httpx.Response:
        return self.client.post(self.url, headers=self.headers, json=message)

    def _only_reply(self, response: httpx.Response, request_id: int) -> dict[str, Any]:
        if response.headers["content-type"].startswith("text/event-stream"):
            messages = list(parse_sse(response.text.splitlines()))
        else:
            messages = [response.json()]
        replies = [m for m in messages if m.get("id") == request_id and "method" not in m]
        assert len(replies) == 1, messages
        return replies[0]

    def rpc(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a request; return the whole JSON-RPC reply (has `result` or `error`)."""
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": next(self._ids), "method": method}
        if params is not None:
            msg["params"] = params
        response = self.post(msg)
        assert response.status_code == 200, response.text
        return self._only_reply(response, msg["id"])

    def result(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = self.rpc(method, params)
        assert "result" in reply, reply
        return dict(reply["result"])

    def start_task(self, name: str, arguments: dict[str, Any], *, key: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"name": name, "arguments": arguments, "task": {"ttl": 60000}}
        if key is not None:
            params["_meta"] = {SUBMISSION_KEY: key}
        return dict(self.result("tools/call", params)["task"])

    def wait_status(self, task_id: str, wanted: set[str], timeout: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            task = self.result("tasks/get", {"taskId": task_id})
            if task["status"] in wanted or time.monotonic() > deadline:
                assert task["status"] in wanted, task
                return task
            time.sleep(0.05)


@pytest.fixture(autouse=True)
def _fresh_adapters() -> Iterator[None]:
    """Shadows the autouse fixture of the same name in tests/conftest.py, which imports
    Django models on teardown: this module must also run with `-p no:django`."""
    yield


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with running_reference_server() as url:
        yield url


@pytest.fixture()
def session(server_url: str) -> Iterator[McpSession]:
    s = McpSession(server_url)
    s.initialize()
    yield s
    s.close()


def test_initialize_advertises_tasks_and_session(server_url: str) -> None:
    s = McpSession(server_url)
    result = s.initialize()
    assert result["protocolVersion"] == PROTOCOL
    assert s.session_id and len(s.session_id) >= 16
    assert result["capabilities"]["tasks"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    s.close()


def test_tools_list_task_support(session: McpSession) -> None:
    tools = {t["name"]: t for t in session.result("tools/list")["tools"]}
    for name in ("sleep_then_complete", "sleep_then_fail", "sleep_then_is_error", "ask_input"):
        assert tools[name]["execution"] == {"taskSupport": "required"}
    # Plain tools carry no `execution` at all (= forbidden).
    assert "execution" not in tools["quick_sync"] and "execution" not in tools["slow_sync"]


def test_task_lifecycle_completed(session: McpSession) -> None:
    task = session.start_task("sleep_then_complete", {"seconds": 0.3, "value": "hello"})
    assert task["status"] == "working"
    assert task["ttl"] == 60000 and task["pollInterval"] == 500
    assert {"taskId", "createdAt", "lastUpdatedAt"} <= task.keys()
    done = session.wait_status(task["taskId"], {"completed"})
    assert done["taskId"] == task["taskId"]
    payload = session.result("tasks/result", {"taskId": task["taskId"]})
    assert payload["content"] == [{"type": "text", "text": "hello"}]
    assert payload["structuredContent"] == {"value": "hello"} and payload["isError"] is False
    assert payload["_meta"][RELATED_TASK] == {"taskId": task["taskId"]}
    listed = session.result("tasks/list")["tasks"]
    assert task["taskId"] in {t["taskId"] for t in listed}


def test_tasks_result_blocks_until_done(session: McpSession) -> None:
    task = session.start_task("sleep_then_complete", {"seconds": 0.5, "value": "later"})
    started = time.monotonic()
    payload = session.result("tasks/result", {"taskId": task["taskId"]})
    assert time.monotonic() - started >= 0.3
    assert payload["content"][0]["text"] == "later"


def test_failed_task_has_meta_only_result(session: McpSession) -> None:
    task = session.start_task("sleep_then_fail", {"seconds": 0.1, "message": "boom"})
    failed = session.wait_status(task["taskId"], {"failed"})
    assert failed["statusMessage"] == "boom"
    # mcp 1.30: no JSON-RPC error, no content: a success carrying only related-task _meta.
    payload = session.result("tasks/result", {"taskId": task["taskId"]})
    assert payload == {"_meta": {RELATED_TASK: {"taskId": task["taskId"]}}}


def test_is_error_result_completes(session: McpSession) -> None:
    task = session.start_task("sleep_then_is_error", {"seconds": 0.1, "message": "bad input"})
    session.wait_status(task["taskId"], {"completed"})
    payload = session.result("tasks/result", {"taskId": task["taskId"]})
    assert payload["isError"] is True and payload["content"][0]["text"] == "bad input"


def _stream_task_result(url: str, headers: dict[str, str], task_id: str, sink: queue.Queue[Any]) -> None:
    """Hold a tasks/result POST open and push every SSE message into `sink` (None at end)."""
    msg = {"jsonrpc": "2.0", "id": 9001, "method": "tasks/result", "params": {"taskId": task_id}}
    try:
        with (
            httpx.Client(timeout=30.0) as client,
            client.stream("POST", url, headers=headers, json=msg) as resp,
        ):
            for event in parse_sse(resp.iter_lines()):
                sink.put(event)
    except Exception as exc:  # surfaced by the test instead of dying silently in the thread
        sink.put(exc)
    sink.put(None)


def _answer_rounds(session: McpSession, task_id: str, answers: list[dict[str, Any]]) -> dict[str, Any]:
    """Open the tasks/result stream, answer each elicitation in turn, return the final reply."""
    events: queue.Queue[Any] = queue.Queue()
    reader = threading.Thread(
        target=_stream_task_result, args=(session.url, session.headers, task_id, events), daemon=True
    )
    reader.start()
    for answer in answers:
        request = events.get(timeout=10)
        assert isinstance(request, dict) and request["method"] == "elicitation/create", request
        params = request["params"]
        assert params["mode"] == "form" and params["_meta"][RELATED_TASK] == {"taskId": task_id}
        assert params["requestedSchema"]["required"] == ["value"]
        # mcp 1.30 ids look like "task-<taskId>-<number>" (strings, not ints).
        assert isinstance(request["id"], str) and request["id"].startswith(f"task-{task_id}-")
        ack = session.post({"jsonrpc": "2.0", "id": request["id"], "result": answer})
        assert ack.status_code == 202, ack.text
    final = events.get(timeout=10)
    assert isinstance(final, dict) and final.get("id") == 9001, final
    assert events.get(timeout=10) is None  # stream closes after the response
    reader.join(timeout=5)
    return final


def test_ask_input_elicitation_round_trip(session: McpSession) -> None:
    task = session.start_task("ask_input", {"question": "Which colour?"})
    session.wait_status(task["taskId"], {"input_required"})
    final = _answer_rounds(session, task["taskId"], [{"action": "accept", "content": {"value": "teal"}}])
    assert final["result"]["content"] == [{"type": "text", "text": "answers: teal"}]
    assert final["result"]["structuredContent"] == {"answers": ["teal"]}
    assert session.wait_status(task["taskId"], {"completed"})["status"] == "completed"


def test_ask_input_two_rounds_and_decline(session: McpSession) -> None:
    task = session.start_task("ask_input", {"question": "Next?", "rounds": 2})
    accept = [{"action": "accept", "content": {"value": v}} for v in ("a", "b")]
    final = _answer_rounds(session, task["taskId"], accept)
    assert final["result"]["content"][0]["text"] == "answers: a,b"

    declined = session.start_task("ask_input", {"question": "Really?"})
    final = _answer_rounds(session, declined["taskId"], [{"action": "decline"}])
    assert final["result"]["isError"] is True


def test_ttl_absent_and_expiry(session: McpSession) -> None:
    # `task: {}` -> the SDK drops the null ttl from the wire (key absent, not null).
    unlimited = session.result(
        "tools/call", {"name": "sleep_then_complete", "arguments": {"seconds": 0, "value": "x"}, "task": {}}
    )["task"]
    assert "ttl" not in unlimited
    short = session.result(
        "tools/call",
        {"name": "sleep_then_complete", "arguments": {"seconds": 0, "value": "x"}, "task": {"ttl": 300}},
    )["task"]
    assert short["ttl"] == 300
    session.wait_status(short["taskId"], {"completed"})
    time.sleep(0.6)  # the SDK counts ttl from the terminal transition, then purges lazily
    assert session.rpc("tasks/get", {"taskId": short["taskId"]})["error"]["code"] == -32602


def test_unknown_task_id_is_invalid_params(session: McpSession) -> None:
    for method in ("tasks/get", "tasks/result", "tasks/cancel"):
        reply = session.rpc(method, {"taskId": "no-such-task"})
        assert reply["error"]["code"] == -32602, reply


def test_cancel_stops_work_and_keeps_session(session: McpSession) -> None:
    task = session.start_task("sleep_then_complete", {"seconds": 0.8, "value": "late"})
    cancelled = session.result("tasks/cancel", {"taskId": task["taskId"]})
    assert cancelled["status"] == "cancelled" and cancelled["taskId"] == task["taskId"]
    time.sleep(1.1)  # past the work's end: status must stay cancelled, session must survive
    assert session.result("tasks/get", {"taskId": task["taskId"]})["status"] == "cancelled"
    again = session.rpc("tasks/cancel", {"taskId": task["taskId"]})
    assert again["error"]["code"] == -32602
    payload = session.result("tasks/result", {"taskId": task["taskId"]})
    assert payload == {"_meta": {RELATED_TASK: {"taskId": task["taskId"]}}}
    assert session.result("tools/list")["tools"]


def test_sync_tools_and_mode_mismatch(session: McpSession) -> None:
    quick = session.result("tools/call", {"name": "quick_sync", "arguments": {"value": "now"}})
    assert quick == {"content": [{"type": "text", "text": "now"}], "isError": False}
    slow = session.result("tools/call", {"name": "slow_sync", "arguments": {"seconds": 0.1}})
    assert slow["content"][0]["text"] == "done"
    # mcp 1.30 reports task-mode violations as isError results, not JSON-RPC errors.
    no_task = session.result(
        "tools/call", {"name": "sleep_then_complete", "arguments": {"seconds": 0, "value": "x"}}
    )
    assert no_task["isError"] is True and "requires task" in no_task["content"][0]["text"]
    forbidden = session.result(
        "tools/call", {"name": "quick_sync", "arguments": {"value": "x"}, "task": {"ttl": 1000}}
    )
    assert forbidden["isError"] is True and "does not support task" in forbidden["content"][0]["text"]


def test_tasks_are_session_scoped_and_survive_other_sessions(server_url: str, session: McpSession) -> None:
    task = session.start_task("sleep_then_complete", {"seconds": 0.1, "value": "mine"})
    other = McpSession(server_url)
    other.initialize()
    assert other.rpc("tasks/get", {"taskId": task["taskId"]})["error"]["code"] == -32602
    assert other.client.delete(server_url, headers=other.headers).status_code == 200
    other.close()
    # Ending another session must not break task creation here (stock 1.30 would).
    after = session.start_task("sleep_then_complete", {"seconds": 0.1, "value": "still"})
    assert session.result("tasks/result", {"taskId": after["taskId"]})["content"][0]["text"] == "still"


def test_stats_count_server_side_operations(server_url: str, session: McpSession) -> None:
    peer_reset(server_url)
    session.start_task("sleep_then_complete", {"seconds": 0, "value": "a"}, key="k-1")
    session.start_task("sleep_then_complete", {"seconds": 0, "value": "a"}, key="k-1")
    session.result("tools/call", {"name": "quick_sync", "arguments": {"value": "b"}})
    stats = peer_stats(server_url)
    assert stats["tasks_created"] == 2  # not cooperating: a repeated key is a second task
    assert stats["tool_calls"] == {"sleep_then_complete": 2, "quick_sync": 1}
    assert stats["submission_keys"] == {"k-1": 2}
    assert peer_lookup(server_url, "k-1") is None  # lookup is a cooperating-only feature
    peer_reset(server_url)
    assert peer_stats(server_url)["tasks_created"] == 0


def test_cooperating_dedups_by_submission_key() -> None:
    with running_reference_server(cooperating=True, poll_interval_ms=250) as url:
        s = McpSession(url)
        s.initialize()
        first = s.start_task("sleep_then_complete", {"seconds": 0.2, "value": "v"}, key="sub-1")
        second = s.start_task("sleep_then_complete", {"seconds": 0.2, "value": "v"}, key="sub-1")
        assert first["pollInterval"] == 250
        assert second["taskId"] == first["taskId"]
        stats = peer_stats(url)
        assert stats["tasks_created"] == 1 and stats["submission_keys"] == {"sub-1": 2}
        assert peer_lookup(url, "sub-1") == first["taskId"]
        assert peer_lookup(url, "sub-1", session_id=s.session_id) == first["taskId"]
        assert peer_lookup(url, "unknown") is None
        # Dedup is per session: tasks of another session are invisible to it anyway.
        other = McpSession(url)
        other.initialize()
        third = other.start_task("sleep_then_complete", {"seconds": 0, "value": "v"}, key="sub-1")
        assert third["taskId"] != first["taskId"] and peer_stats(url)["tasks_created"] == 2
        s.close()
        other.close()
