"""Total decoding in the tasks-extension and AIP-151 adapters, against canned hostile answers
served over real HTTP (Shape A's are in tests/toolops/test_hostile_server.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from adapters import McpTasksExt2026Adapter, ProtocolViolationError, limits
from adapters.aip151 import Aip151Adapter

DEEP = "[" * 5000 + "1" + "]" * 5000
EXT_TASK = ('{"taskId": "t-1", "status": "working", "createdAt": "2026-01-01T00:00:00Z", '
            '"ttlMs": 60000, "pollIntervalMs": 100')
# case -> the `result` of the JSON-RPC answer, as raw JSON text (some of it json.dumps cannot write)
EXT: dict[str, str] = {
    "status_outside": EXT_TASK.replace('"working"', '"paused"') + "}",
    "ttl_negative": EXT_TASK.replace("60000", "-5") + "}",
    "poll_huge": EXT_TASK.replace('"pollIntervalMs": 100', '"pollIntervalMs": 1099511627776') + "}",
    "ttl_huge": EXT_TASK.replace("60000", "100000000000000000000") + "}",
    "created_naive": EXT_TASK.replace("00:00:00Z", "00:00:00") + "}",
    "message_nul": EXT_TASK + ', "statusMessage": "a\\u0000b"}',
    "deep": EXT_TASK + ', "_meta": {"x": ' + DEEP + "}}",
    "result_big_int": EXT_TASK.replace('"working"', '"completed"')
    + ', "result": {"content": [], "structuredContent": {"n": 1000000000000000000000000000000}}}',
    "input_flood": EXT_TASK.replace('"working"', '"input_required"') + ', "inputRequests": {'
    + ", ".join(f'"k{i}": {{"method": "elicitation/create", "params": {{}}}}' for i in range(100)) + "}}",
    "long_id": EXT_TASK.replace('"t-1"', json.dumps("t" * 1000)) + "}",
}
OP = '{"name": "op-1", "done": true'
AIP: dict[str, str] = {
    "nul": OP + ', "response": {"text": "a\\u0000b"}}',
    "surrogate": OP + ', "response": {"text": "a\\ud800b"}}',
    "deep": OP + ', "response": {"x": ' + DEEP + "}}",
    "big_int": OP + ', "response": {"n": 1000000000000000000000000000000}}',
    "float_overflow": OP + ', "response": {"x": 1e400}}',
    "long_name": OP.replace('"op-1"', json.dumps("o" * 1000)) + ', "response": {}}',
    "huge_message": OP + ', "error": {"code": 13, "message": ' + json.dumps("m" * 50_000) + "}}",
}


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["content-length"])))
        parts = self.path.strip("/").split("/")
        if parts[0] == "ext":
            result = EXT[parts[1]]
            rpc_id = json.dumps(request["id"])
            self._answer(f'{{"jsonrpc": "2.0", "id": {rpc_id}, "result": {result}}}'.encode())
        else:  # an AIP-151 create
            self._answer(AIP[parts[1]].encode())

    def do_GET(self) -> None:
        self._answer(AIP[self.path.strip("/").split("/")[1]].encode())


@pytest.fixture(autouse=True)
def _fresh_adapters() -> Iterator[None]:
    """Overrides the repo-wide fixture of this name: these tests need no Django."""
    yield


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("case", "reason"), [
    ("status_outside", "status outside the spec"),
    ("ttl_negative", "ttlMs is negative"),
    ("created_naive", "createdAt has no time zone"),
    ("message_nul", "NUL"),
    ("deep", "nested too deep"),
    ("result_big_int", "canonical-JSON range"),
    ("input_flood", "more than 64 input requests"),
    ("long_id", "taskId longer than 300"),
])
def test_extension_violations(base_url: str, case: str, reason: str) -> None:
    with McpTasksExt2026Adapter(url=f"{base_url}/ext/{case}") as adapter:
        with pytest.raises(ProtocolViolationError, match=reason):
            adapter.get(remote_id="t-1")


def test_extension_long_task_id_in_a_create_reply(base_url: str) -> None:
    with McpTasksExt2026Adapter(url=f"{base_url}/ext/long_id") as adapter:
        with pytest.raises(ProtocolViolationError, match="taskId longer than 300"):
            adapter.submit(tool="t", arguments={}, ttl_ms=None, submission_key="k")


def test_extension_clamps(base_url: str) -> None:
    with McpTasksExt2026Adapter(url=f"{base_url}/ext/poll_huge") as adapter:
        assert adapter.get(remote_id="t-1").poll_interval_ms == limits.POLL_INTERVAL_MAX_MS
    with McpTasksExt2026Adapter(url=f"{base_url}/ext/ttl_huge") as adapter:
        assert adapter.get(remote_id="t-1").ttl_ms == limits.TTL_MAX_MS


def _aip(base_url: str, case: str) -> Aip151Adapter:
    method = {"http_method": "POST", "path": f"aip/{case}"}
    options = {"operations_prefix": "ops", "methods": {"render": method}}
    return Aip151Adapter(url=f"{base_url}/aip/{case}", options=options)


@pytest.mark.parametrize(("case", "reason"), [
    ("nul", "NUL"), ("surrogate", "lone surrogate"), ("deep", "nested too deep"),
    ("big_int", "canonical-JSON range"), ("float_overflow", "double range"),
    ("long_name", "name longer than 300"),
])
def test_aip151_violations(base_url: str, case: str, reason: str) -> None:
    with _aip(base_url, case) as adapter, pytest.raises(ProtocolViolationError, match=reason):
        adapter.get(remote_id="op-1")


def test_aip151_long_name_in_a_create_reply(base_url: str) -> None:
    with _aip(base_url, "long_name") as adapter, \
            pytest.raises(ProtocolViolationError, match="longer than 300"):
        adapter.submit(tool="render", arguments={}, ttl_ms=None, submission_key="k-1")


def test_aip151_huge_error_message_is_cut(base_url: str) -> None:
    with _aip(base_url, "huge_message") as adapter:
        task = adapter.get(remote_id="op-1")
    assert task.status == "failed" and task.status_message is not None
    assert len(task.status_message) == limits.STATUS_MESSAGE_MAX_CHARS
    assert task.status_message.endswith("characters]")
