"""The HTTP/1.1 transport against real sockets: a threaded http.server, plain and TLS.

What is checked is what the adapters rely on: connections are kept and reused, but never one a
server closed or one left with a reply half read; failures arrive as httpx's exceptions split by
whether anything was sent; bodies stream as they come; a header that could split the request is
never written.
"""

from __future__ import annotations

import datetime
import gzip
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.deadline import request_deadline
from adapters.http11 import Http11Transport, tcp_connect

SEEN: list[tuple[str, int]] = []  # (path, client port) of every request the server read
_SEEN_LOCK = threading.Lock()


RAW_REPLIES = {
    # Repeated names, a folded continuation line, a name in any case.
    "headers": (b"HTTP/1.1 200 OK\r\nX-Twice: one\r\nx-twice: two\r\nX-Folded: first\r\n"
                b"\t second\r\nmcp-session-id: s-1\r\nContent-Length: 2\r\n\r\nok"),
    # An interim 100 reply before the real one.
    "continue": (b"HTTP/1.1 100 Continue\r\nX-Interim: yes\r\n\r\n"
                 b"HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\nmade"),
    "chunked": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"),
    "close": b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbye",
    "no-colon": b"HTTP/1.1 200 OK\r\nthis is not a header\r\nContent-Length: 0\r\n\r\n",
    "space-before-colon": b"HTTP/1.1 200 OK\r\nX-Bad : 1\r\nContent-Length: 0\r\n\r\n",
    "too-many": (b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(101))
                 + b"Content-Length: 0\r\n\r\n"),
    "long-line": b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70000 + b"\r\nContent-Length: 0\r\n\r\n",
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        with _SEEN_LOCK:
            SEEN.append((self.path, self.client_address[1]))
        route = self.path.strip("/")
        if route == "echo":
            self._reply(200, body)
        elif route == "close":
            self._reply(200, b"bye", extra={"Connection": "close"})
        elif route == "drop-after":
            # Answers as if keeping the connection, then closes it: the next request must not use it.
            self._reply(200, b"dropped")
            self.close_connection = True
        elif route == "no-answer":
            self.close_connection = True
        elif route == "garbage":
            self.wfile.write(b"NOT-HTTP\r\n\r\n")
            self.close_connection = True
        elif route == "slow":
            time.sleep(1.5)
            self._reply(200, b"late")
        elif route == "big":
            self._reply(200, b"x" * 200_000)
        elif route == "gzip":
            self._reply(200, gzip.compress(b'{"ok":true}'), extra={"Content-Encoding": "gzip"})
        elif route.startswith("raw-"):
            # A reply written byte for byte (RAW_REPLIES), for header blocks http.server would
            # not produce; the connection is kept only where the reply says so.
            try:
                self.wfile.write(RAW_REPLIES[route[4:]])
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client refused the block and closed before all of it was written
            self.close_connection = b"Connection: close" in RAW_REPLIES[route[4:]]
        elif route == "stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in (b"data: one\n\n", b"data: two\n\n"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
                time.sleep(0.5)
            self.wfile.write(b"0\r\n\r\n")

    def _reply(self, status: int, body: bytes, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(autouse=True)
def _fresh_adapters() -> Iterator[None]:
    """Overrides the repo-wide fixture of this name: these tests need no Django."""
    yield


def _serve(server: ThreadingHTTPServer) -> Iterator[int]:
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    yield from _serve(ThreadingHTTPServer(("127.0.0.1", 0), _Handler))


@pytest.fixture
def wire() -> Iterator[Http11Transport]:
    SEEN.clear()
    transport = Http11Transport()
    yield transport
    transport.close()


def _post(wire: Http11Transport, url: str, body: bytes = b"{}",
          headers: dict[str, str] | None = None) -> httpx.Response:
    request = httpx.Request("POST", url, content=body, headers=headers or {},
                            extensions={"timeout": {"connect": 5.0, "read": 5.0, "write": 5.0, "pool": 5.0}})
    response = wire.handle_request(request)
    response.read()
    response.close()
    return response


def _ports(path: str) -> list[int]:
    return [p for seen_path, p in SEEN if seen_path == path]


def test_a_connection_is_kept_and_reused(wire: Http11Transport, port: int) -> None:
    for i in range(3):
        assert _post(wire, f"http://127.0.0.1:{port}/echo", b"n%d" % i).content == b"n%d" % i
    assert len(set(_ports("/echo"))) == 1


def test_a_connection_the_server_closes_is_not_reused(wire: Http11Transport, port: int) -> None:
    assert _post(wire, f"http://127.0.0.1:{port}/close").content == b"bye"
    assert _post(wire, f"http://127.0.0.1:{port}/drop-after").content == b"dropped"
    time.sleep(0.2)  # the server's FIN reaches us while the connection sits idle
    assert _post(wire, f"http://127.0.0.1:{port}/echo", b"after").content == b"after"
    closed, dropped, fresh = _ports("/close")[0], _ports("/drop-after")[0], _ports("/echo")[0]
    assert len({closed, dropped, fresh}) == 3


def test_a_reply_left_half_read_closes_its_connection(wire: Http11Transport, port: int) -> None:
    request = httpx.Request("POST", f"http://127.0.0.1:{port}/big", content=b"{}")
    response = wire.handle_request(request)
    first = next(response.iter_raw())
    assert 0 < len(first) < 200_000
    response.close()
    _post(wire, f"http://127.0.0.1:{port}/echo")
    assert _ports("/big")[0] != _ports("/echo")[0]


def test_a_header_that_could_split_the_request_is_never_sent(wire: Http11Transport, port: int) -> None:
    with pytest.raises(httpx.LocalProtocolError):
        _post(wire, f"http://127.0.0.1:{port}/echo", headers={"X-Evil": "a\r\nX-Injected: 1"})
    assert SEEN == []


def test_failures_are_split_by_whether_anything_was_sent(wire: Http11Transport, port: int) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed_port = unused.getsockname()[1]
    with pytest.raises(httpx.ConnectError):
        _post(wire, f"http://127.0.0.1:{closed_port}/echo")
    with pytest.raises(httpx.RemoteProtocolError, match="disconnected"):
        _post(wire, f"http://127.0.0.1:{port}/no-answer")
    with pytest.raises(httpx.RemoteProtocolError, match="malformed"):
        _post(wire, f"http://127.0.0.1:{port}/garbage")
    with pytest.raises(httpx.UnsupportedProtocol):
        _post(wire, f"ftp://127.0.0.1:{port}/echo")
    assert _post(wire, f"http://127.0.0.1:{port}/echo", b"still fine").content == b"still fine"


def test_a_read_past_the_request_deadline_is_a_read_timeout(wire: Http11Transport, port: int) -> None:
    started = time.monotonic()
    with request_deadline(started + 0.3), pytest.raises(httpx.ReadTimeout) as info:
        _post(wire, f"http://127.0.0.1:{port}/slow")
    assert time.monotonic() - started < 1.2  # cut at the deadline, not at the 5 s read timeout
    assert info.value.__cause__ is not info.value  # chained to the socket's failure, never to itself


def test_a_stream_hands_on_each_event_as_it_arrives(wire: Http11Transport, port: int) -> None:
    request = httpx.Request("POST", f"http://127.0.0.1:{port}/stream", content=b"{}")
    started = time.monotonic()
    response = wire.handle_request(request)
    seen = []
    for line in response.iter_lines():
        if line:
            seen.append((line, time.monotonic() - started))
    response.close()
    assert [line for line, _ in seen] == ["data: one", "data: two"]
    assert seen[0][1] < 0.4 <= seen[1][1]  # the first came before the server sent the second
    assert isinstance(response.extensions["network_stream"].get_extra_info("socket"), socket.socket)


def test_a_compressed_body_is_decoded_by_the_response(wire: Http11Transport, port: int) -> None:
    assert _post(wire, f"http://127.0.0.1:{port}/gzip").json() == {"ok": True}


def test_threads_share_the_pool_and_every_answer_is_their_own(wire: Http11Transport, port: int) -> None:
    def one(i: int) -> bytes:
        return _post(wire, f"http://127.0.0.1:{port}/echo", b"%d" % i).content

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(400)))
    assert answers == [b"%d" % i for i in range(400)]
    assert len(set(_ports("/echo"))) <= 8  # connections were reused, not opened per request


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, ssl.SSLContext]]:
    """A TLS server whose certificate names `localhost` only, and a context that trusts it."""
    crypto = pytest.importorskip("cryptography")
    del crypto
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    folder: Path = tmp_path_factory.mktemp("tls")
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                       serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.socket = server_side.wrap_socket(server.socket, server_side=True)
    client_side = ssl.create_default_context(cafile=str(folder / "cert.pem"))
    for tls_port in _serve(server):
        yield tls_port, client_side


def test_tls_is_verified_against_the_url_host_not_the_address(tls: tuple[int, ssl.SSLContext]) -> None:
    tls_port, trusted = tls
    connected: list[str] = []

    def to_loopback(host: str, port: int, timeout: float | None) -> socket.socket:
        # As the executor's policy does: the name resolved once, the socket opened to an address.
        connected.append(host)
        return tcp_connect(str(ipaddress.ip_address("127.0.0.1")), port, timeout)

    wire = Http11Transport(connect=to_loopback, ssl_context=trusted)
    try:
        assert _post(wire, f"https://localhost:{tls_port}/echo", b"secret").content == b"secret"
        assert connected == ["localhost"]
        # The same server reached by a name its certificate does not hold is refused.
        with pytest.raises(httpx.ConnectError, match="TLS"):
            _post(wire, f"https://127.0.0.1:{tls_port}/echo")
    finally:
        wire.close()
    untrusting = Http11Transport(connect=to_loopback)  # httpx's default context: public CAs only
    try:
        with pytest.raises(httpx.ConnectError, match="TLS"):
            _post(untrusting, f"https://localhost:{tls_port}/echo")
    finally:
        untrusting.close()


def test_a_header_block_keeps_every_header_as_sent(wire: Http11Transport, port: int) -> None:
    response = _post(wire, f"http://127.0.0.1:{port}/raw-headers")
    assert response.status_code == 200 and response.content == b"ok"
    assert response.headers.get_list("x-twice") == ["one", "two"]
    assert response.headers["X-Folded"] == "first second"
    assert response.headers["Mcp-Session-Id"] == "s-1"
    # Length-framed and read to its end: the connection is kept and used again.
    _post(wire, f"http://127.0.0.1:{port}/raw-headers")
    assert len(set(_ports("/raw-headers"))) == 1


def test_framing_follows_the_header_block(wire: Http11Transport, port: int) -> None:
    interim = _post(wire, f"http://127.0.0.1:{port}/raw-continue")
    assert interim.status_code == 201 and interim.content == b"made" and "x-interim" not in interim.headers
    chunked = _post(wire, f"http://127.0.0.1:{port}/raw-chunked")
    assert chunked.content == b"abcde"
    closing = _post(wire, f"http://127.0.0.1:{port}/raw-close")
    assert closing.content == b"bye"
    _post(wire, f"http://127.0.0.1:{port}/raw-close")
    assert len(set(_ports("/raw-close"))) == 2  # "Connection: close" is never reused


@pytest.mark.parametrize("reply", ["no-colon", "space-before-colon", "too-many", "long-line"])
def test_a_malformed_header_block_is_a_protocol_error(wire: Http11Transport, port: int,
                                                     reply: str) -> None:
    with pytest.raises(httpx.RemoteProtocolError, match="malformed HTTP reply"):
        _post(wire, f"http://127.0.0.1:{port}/raw-{reply}")
    # The transport is still usable afterwards.
    assert _post(wire, f"http://127.0.0.1:{port}/echo", body=b"fine").content == b"fine"
