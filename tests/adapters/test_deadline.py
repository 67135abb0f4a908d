"""A wall-clock deadline per request and the response size cap, against a real trickling server.

The server (a plain threaded http.server) sends one byte at a time for far longer than the
deadline: in the status line and headers, in a JSON body, or as SSE keep-alives. httpx's per-read
timeouts never fire on it, so only the request deadline can end these calls.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from adapters import (
    LostResponseError,
    McpTasks2025Adapter,
    McpTasksExt2026Adapter,
    ProtocolViolationError,
    TransientError,
)
from adapters.aip151 import Aip151Adapter
from adapters.deadline import install_deadline
from adapters.http11 import Http11Transport

DEADLINE_S = 1.5
TRICKLE_FOR_S = 40.0  # far beyond the deadline: a call that ends early was cut by it
SLACK_S = 8.0
SENT: dict[str, int] = {}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _drain(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._drain()
        self._serve()

    def _trickle(self, data: bytes) -> None:
        until = time.monotonic() + TRICKLE_FOR_S
        for i in range(len(data) * 1000):
            if time.monotonic() > until:
                return
            self.wfile.write(data[i % len(data): i % len(data) + 1])
            self.wfile.flush()
            time.sleep(0.2)

    def _serve(self) -> None:
        mode = self.path.rstrip("/").rsplit("/", 1)[-1].split(":")[0]
        with contextlib.suppress(OSError):
            if mode == "trickle-headers":
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                self._trickle(b"X-Slow: " + b"a" * 100)
            elif mode == "trickle-body":
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", "100000")
                self.end_headers()
                self._trickle(b" ")
            elif mode == "trickle-sse":
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                self._trickle(b":\n")
            elif mode == "endless":
                # Chunked, no length: only counting while reading can stop it.
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                chunk = b"[" + b"1," * 32_000
                SENT["endless"] = 0
                while SENT["endless"] < 200 * 1024 * 1024:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    SENT["endless"] += len(chunk)


@pytest.fixture(autouse=True)
def _fresh_adapters() -> Iterator[None]:
    """Overrides the repo-wide fixture of this name: these tests need no Django."""
    yield


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(params=["httpx", "http11"])
def transport(request: pytest.FixtureRequest) -> Iterator[Http11Transport | None]:
    """Both wires the adapters run on: httpx's own transport (with the deadline backend the
    adapters install) and the executor's HTTP/1.1 transport, which bounds every read itself."""
    if request.param == "httpx":
        yield None
        return
    wire = Http11Transport()
    yield wire
    wire.close()


def _timed(fn: Any) -> tuple[BaseException, float]:
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        fn()
    return info.value, time.monotonic() - started


def _mcp(url: str, transport: Http11Transport | None = None, **kwargs: Any) -> McpTasks2025Adapter:
    return McpTasks2025Adapter(url=url, timeout_s=30.0, request_deadline_s=DEADLINE_S, transport=transport,
                               **kwargs)


@pytest.mark.parametrize("mode", ["trickle-headers", "trickle-body", "trickle-sse"])
def test_a_trickled_read_ends_at_the_deadline_as_transient(base_url: str, mode: str,
                                                          transport: Http11Transport | None) -> None:
    with _mcp(f"{base_url}/{mode}", transport) as adapter:
        error, elapsed = _timed(lambda: adapter.get(remote_id="t-1"))
    assert isinstance(error, TransientError) and error.detail["deadline"] is True, repr(error)
    assert DEADLINE_S * 0.9 <= elapsed < DEADLINE_S + SLACK_S


@pytest.mark.parametrize("mode", ["trickle-headers", "trickle-body", "trickle-sse"])
def test_a_trickled_tools_call_ends_at_the_deadline_as_maybe_created(
    base_url: str, mode: str, transport: Http11Transport | None
) -> None:
    with _mcp(f"{base_url}/{mode}", transport) as adapter:
        error, elapsed = _timed(lambda: adapter.submit(tool="t", arguments={}, ttl_ms=None,
                                                       submission_key="k"))
    assert isinstance(error, LostResponseError), repr(error)
    assert elapsed < DEADLINE_S + SLACK_S


def test_the_tasks_extension_has_the_same_deadline(base_url: str) -> None:
    adapter = McpTasksExt2026Adapter(url=f"{base_url}/trickle-body", request_deadline_s=DEADLINE_S)
    error, elapsed = _timed(lambda: adapter.get(remote_id="t-1"))
    assert isinstance(error, TransientError) and elapsed < DEADLINE_S + SLACK_S
    error, elapsed = _timed(lambda: adapter.submit(tool="t", arguments={}, ttl_ms=None, submission_key="k"))
    assert isinstance(error, LostResponseError) and elapsed < DEADLINE_S + SLACK_S
    adapter.close()


def _aip(base_url: str, mode: str, transport: Http11Transport | None = None, **kwargs: Any) -> Aip151Adapter:
    options = {"operations_prefix": "ops", "methods": {"render": {"http_method": "POST", "path": mode}}}
    return Aip151Adapter(url=base_url, options=options, timeout_s=30.0, transport=transport, **kwargs)


@pytest.mark.parametrize("mode", ["trickle-headers", "trickle-body"])
def test_aip151_calls_end_at_one_deadline_for_all_their_attempts(
    base_url: str, mode: str, transport: Http11Transport | None
) -> None:
    with _aip(base_url, mode, transport, request_deadline_s=DEADLINE_S) as adapter:
        error, elapsed = _timed(lambda: adapter.get(remote_id=mode))
        assert isinstance(error, TransientError) and error.detail.get("deadline"), repr(error)
        assert elapsed < DEADLINE_S + SLACK_S
        error, elapsed = _timed(lambda: adapter.submit(tool="render", arguments={}, ttl_ms=None,
                                                       submission_key="k-1"))
        assert isinstance(error, LostResponseError), repr(error)
        assert elapsed < DEADLINE_S + SLACK_S


def test_an_endless_body_stops_at_the_size_cap_without_reading_on(base_url: str,
                                                                  transport: Http11Transport | None) -> None:
    cap = 100_000
    with _mcp(f"{base_url}/endless", transport, max_response_bytes=cap) as adapter:
        error, _ = _timed(lambda: adapter.get(remote_id="t-1"))
    assert isinstance(error, ProtocolViolationError) and "size limit" in str(error)
    with _aip(base_url, "endless", transport, max_response_bytes=cap) as aip:
        error, _ = _timed(lambda: aip.get(remote_id="endless"))
    assert isinstance(error, ProtocolViolationError) and error.detail["max_response_bytes"] == cap
    # The server stopped long before its 200 MiB: the client closed the connection at the cap.
    time.sleep(0.5)
    assert SENT["endless"] < 50 * 1024 * 1024


def test_the_backend_is_installed_on_default_clients() -> None:
    import httpx

    with httpx.Client() as client:
        assert install_deadline(client) >= 1
        assert install_deadline(client) == 0  # idempotent
