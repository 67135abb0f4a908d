"""A wall-clock deadline per request, enforced on every socket read and write.

httpx's timeouts are per read: a server that trickles one byte every few seconds (headers or
body) never trips them. The adapters run each exchange inside `request_deadline(at)`; the
network backend installed by `install_deadline` gives every connect, read and write the
smaller of its own timeout and the time left, and fails it once the deadline has passed, so a
trickle is cut at the deadline wherever it happens. The deadline lives in a context variable:
it belongs to the thread running the exchange (a background stream reader has none and keeps
its own idle timeout).
"""

from __future__ import annotations

import contextlib
import contextvars
import ssl
import time
import typing
from collections.abc import Iterable, Iterator

import httpcore
import httpx

_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "adapters_request_deadline", default=None
)


@contextlib.contextmanager
def request_deadline(at: float | None) -> Iterator[None]:
    """Every socket operation of this thread, until exit, ends by monotonic time `at`."""
    token = _deadline.set(at)
    try:
        yield
    finally:
        _deadline.reset(token)


def bounded_timeout(timeout: float | None, error: type[Exception]) -> float | None:
    """`timeout` cut to the time left before this thread's request deadline; `error` once it passed."""
    at = _deadline.get()
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise error("request deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, bounded_timeout(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, bounded_timeout(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        tls = self._inner.start_tls(ssl_context, server_hostname,
                                    bounded_timeout(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(tls)

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
                    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, bounded_timeout(timeout, httpcore.ConnectTimeout),
                                         local_address, socket_options)
        return _DeadlineStream(stream)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
                            ) -> httpcore.NetworkStream:
        stream = self._inner.connect_unix_socket(path, bounded_timeout(timeout, httpcore.ConnectTimeout),
                                                 socket_options)
        return _DeadlineStream(stream)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def install_deadline(client: httpx.Client) -> int:
    """Wrap the network backend of every httpx-made transport of `client` (its default one and
    the proxy mounts from the environment); returns how many were wrapped. Transports passed in
    by a caller are left alone (the adapters still check the deadline between body chunks).
    These are httpx/httpcore internals: tests/adapters/test_deadline.py proves it still works."""
    transports = [client._transport, *client._mounts.values()]
    wrapped = 0
    for transport in transports:
        pool = getattr(transport, "_pool", None) if isinstance(transport, httpx.HTTPTransport) else None
        backend = getattr(pool, "_network_backend", None)
        if backend is not None and not isinstance(backend, _DeadlineBackend):
            pool._network_backend = _DeadlineBackend(backend)  # type: ignore[union-attr]
            wrapped += 1
    return wrapped


__all__ = ["bounded_timeout", "install_deadline", "request_deadline"]
