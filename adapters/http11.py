"""An httpx transport that speaks HTTP/1.1 through the standard library's `http.client`.

Why not httpx's own transport: on a fast server the exchange is most of a poll's CPU, and
httpcore's pure-Python HTTP/1.1 state machine (h11) spends about 2.5 times what `http.client`
does for the same request and reply (benchmarks/http_transport.py measures both). The adapters
keep their httpx interface (requests, responses, streams, the error taxonomy); only the wire
underneath changes.

What it keeps from httpx's transport, on purpose:
* keep-alive connections per origin, shared by threads; a connection is reused only if it was
  left with its reply fully read and the socket shows nothing pending (a server that closed an
  idle connection is seen here, before anything is written to it);
* the request deadline of adapters/deadline.py on every connect, write and read: each socket
  operation gets the smaller of its own timeout and the time left, so a server that trickles a
  byte at a time is cut at the deadline;
* httpx's exceptions, by what reached the server: `ConnectError`/`ConnectTimeout` when nothing
  was written, `WriteError`/`ReadError`/`ReadTimeout`/`RemoteProtocolError` once it may have been;
  a header value with CR, LF or NUL is a `LocalProtocolError` and is never sent;
* TLS verified against the host name (httpx's default context), whatever address `connect` chose;
* the `network_stream` extension, whose `get_extra_info("socket")` lets a stream reader be woken.

Content decoding (gzip) and cookies stay in httpx's Response and the client.

`connect(host, port, timeout)` opens the TCP socket; the executor passes one that resolves the
name once, checks every address against its URL policy and connects only to a checked address.
"""

from __future__ import annotations

import collections
import http.client
import io
import select
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import httpx

from adapters.deadline import bounded_timeout
from adapters.http11_reply import Http11Reply

Connect = Callable[[str, int, float | None], socket.socket]
Origin = tuple[str, str, int]

# Idle keep-alive connections kept per origin: httpcore's default, so a worker polling one server
# from many threads holds as many sockets as it did before.
MAX_IDLE_PER_ORIGIN = 20
# One recv() per call of the body reader: large enough that a reply arrives in a few calls,
# small enough that a stream hands each server-sent event on as it comes.
READ_CHUNK = 65536
_FORBIDDEN_IN_HEADERS = (b"\r", b"\n", b"\0")
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})
_BODYLESS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})


def tcp_connect(host: str, port: int, timeout: float | None) -> socket.socket:
    """Plain `socket.create_connection`: for callers without an address policy."""
    try:
        return socket.create_connection((host, port), timeout=bounded_timeout(timeout, httpx.ConnectTimeout))
    except Exception as exc:
        _raise_mapped(_wire_error(exc, timeout=httpx.ConnectTimeout, failure=httpx.ConnectError,
                                  what=f"connect to {host}:{port}"), exc)


class _NetworkStream:
    """What `response.extensions["network_stream"]` offers: the socket, for a reader to wake."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def get_extra_info(self, info: str) -> Any:
        return self._sock if info == "socket" else None


class _DeadlineReader(io.RawIOBase):
    """The socket as a raw stream whose every read is bounded by the request deadline. Closing
    it leaves the socket open: on a keep-alive connection the socket outlives one reply."""

    def __init__(self, sock: socket.socket, timeout: float | None) -> None:
        self._sock = sock
        self._timeout = timeout

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(bounded_timeout(self._timeout, httpx.ReadTimeout))
        return self._sock.recv_into(buffer)


class _SocketFile:
    """What `http.client.HTTPResponse` reads from: a buffered, deadline-bounded socket."""

    def __init__(self, sock: socket.socket, timeout: float | None) -> None:
        self._sock = sock
        self._timeout = timeout

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._timeout))


def _socket_idle(sock: socket.socket) -> bool:
    """True when nothing is pending on a kept connection: no EOF, no unasked-for bytes. poll(),
    not select(): a worker with over 1,024 descriptors open would otherwise reuse nothing."""
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False


def _wire_error(exc: Exception, *, timeout: type[httpx.TimeoutException],
                failure: type[httpx.TransportError], what: str) -> httpx.TransportError:
    """A socket failure as the httpx exception of its step (connect, write or read)."""
    if isinstance(exc, httpx.TransportError):
        return exc
    if isinstance(exc, TimeoutError):
        return timeout(f"{what} timed out: {exc}")
    return failure(f"{what} failed: {exc}")


def _raise_mapped(error: httpx.TransportError, exc: BaseException) -> NoReturn:
    """Raise `error`, chained to the failure it was made from (not to itself when it is one)."""
    if error is exc:
        raise error
    raise error from exc


def _read_errors(exc: Exception) -> httpx.TransportError:
    if isinstance(exc, http.client.RemoteDisconnected):
        return httpx.RemoteProtocolError("server disconnected without sending a response")
    if isinstance(exc, http.client.HTTPException):
        return httpx.RemoteProtocolError(f"malformed HTTP reply: {type(exc).__name__}: {exc}")
    return _wire_error(exc, timeout=httpx.ReadTimeout, failure=httpx.ReadError, what="read")


class _Body(httpx.SyncByteStream):
    """The reply body as it arrives; on close the connection goes back to the pool only if the
    reply was read to its end and the server did not ask to close it."""

    def __init__(self, transport: Http11Transport, origin: Origin, sock: socket.socket,
                 reply: Http11Reply) -> None:
        self._transport = transport
        self._origin = origin
        self._sock: socket.socket | None = sock
        self._reply = reply

    def __iter__(self) -> Iterator[bytes]:
        while True:
            try:
                chunk = self._reply.read1(READ_CHUNK)
            except Exception as exc:  # every read failure is one of httpx's transport errors
                self._discard()
                _raise_mapped(_read_errors(exc), exc)
            if not chunk:
                return
            yield chunk

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        # A length-framed reply read to its end leaves `length` at 0 without closing (http.client
        # closes on the read after the end); a chunked one closes at its last chunk.
        done = (self._reply.isclosed() or self._reply.length == 0) and not self._reply.will_close
        self._reply.close()
        if done:
            self._transport._release(self._origin, sock)
        else:
            _close(sock)

    def _discard(self) -> None:
        sock, self._sock = self._sock, None
        self._reply.close()
        if sock is not None:
            _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


class Http11Transport(httpx.BaseTransport):
    """HTTP/1.1 over `http.client`, with a keep-alive pool per origin (see the module doc)."""

    def __init__(self, *, connect: Connect = tcp_connect, ssl_context: ssl.SSLContext | None = None,
                 max_idle_per_origin: int = MAX_IDLE_PER_ORIGIN) -> None:
        self._connect = connect
        self._ssl_context = ssl_context
        self._max_idle = max_idle_per_origin
        self._idle: dict[Origin, collections.deque[socket.socket]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        scheme = url.scheme
        if scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"scheme {scheme!r} is not supported")
        host = url.host
        port = url.port or (443 if scheme == "https" else 80)
        origin = (scheme, host, port)
        timeouts = request.extensions.get("timeout") or {}
        head, body = _request_bytes(request)
        sock = self._acquire(origin, timeouts.get("connect"))
        try:
            sock.settimeout(bounded_timeout(timeouts.get("write"), httpx.WriteTimeout))
            sock.sendall(head + body if len(body) <= READ_CHUNK else head)
            if len(body) > READ_CHUNK:
                sock.sendall(body)
        except Exception as exc:
            _close(sock)
            _raise_mapped(_wire_error(exc, timeout=httpx.WriteTimeout, failure=httpx.WriteError,
                                      what="write"), exc)
        reply = Http11Reply(_SocketFile(sock, timeouts.get("read")),  # type: ignore[arg-type]
                            method=request.method)
        try:
            reply.begin()
        except Exception as exc:
            reply.close()
            _close(sock)
            _raise_mapped(_read_errors(exc), exc)
        return httpx.Response(
            reply.status,
            headers=reply.raw_headers,
            stream=_Body(self, origin, sock, reply),
            extensions={"http_version": b"HTTP/1.1",
                        "reason_phrase": (reply.reason or "").encode("latin-1", "replace"),
                        "network_stream": _NetworkStream(sock)},
        )

    def _acquire(self, origin: Origin, connect_timeout: float | None) -> socket.socket:
        with self._lock:
            idle = self._idle.get(origin)
            while idle:
                sock = idle.pop()
                if _socket_idle(sock):
                    return sock
                _close(sock)
        scheme, host, port = origin
        sock = self._connect(host, port, connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if scheme == "https":
                context = self._ssl_context
                if context is None:
                    context = self._ssl_context = httpx.create_ssl_context()
                sock.settimeout(bounded_timeout(connect_timeout, httpx.ConnectTimeout))
                # Verified against the name the URL holds, not the address connected to.
                sock = context.wrap_socket(sock, server_hostname=host)
        except Exception as exc:
            _close(sock)
            _raise_mapped(_wire_error(exc, timeout=httpx.ConnectTimeout, failure=httpx.ConnectError,
                                      what="TLS handshake"), exc)
        return sock

    def _release(self, origin: Origin, sock: socket.socket) -> None:
        with self._lock:
            if not self._closed:
                idle = self._idle.setdefault(origin, collections.deque())
                if len(idle) < self._max_idle:
                    idle.append(sock)
                    return
        _close(sock)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            kept = [sock for idle in self._idle.values() for sock in idle]
            self._idle.clear()
        for sock in kept:
            _close(sock)


def _request_bytes(request: httpx.Request) -> tuple[bytes, bytes]:
    """The request line and headers, and the body, as sent. httpx.Request already holds Host;
    a value that could split the header block is refused before sending."""
    body = request.read()
    target = request.url.raw_path
    lines = [request.method.encode("ascii") + b" " + target + b" HTTP/1.1"]
    for name, value in request.headers.raw:
        for bad in _FORBIDDEN_IN_HEADERS:
            if bad in name or bad in value:
                raise httpx.LocalProtocolError(f"header {name!r} holds a control character")
        if name.lower() not in _FRAMING:
            lines.append(name + b": " + value)
    # The body is whole in memory, so it is always framed by its length.
    if body or request.method not in _BODYLESS:
        lines.append(b"Content-Length: " + str(len(body)).encode("ascii"))
    return b"\r\n".join(lines) + b"\r\n\r\n", body


__all__ = ["MAX_IDLE_PER_ORIGIN", "Http11Transport", "tcp_connect"]
