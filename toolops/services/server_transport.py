"""The httpx transport every adapter talks through: the URL policy at connect time, credentials
added at send time.

Connect time: httpcore opens sockets through a network backend; ours resolves the host itself,
checks every address with the server URL policy (toolops/services/url_policy.py) and connects to
an address it checked. The name is never resolved twice between check and connect, so a DNS
answer that changes after registration (rebinding) cannot reach a refused address. TLS still
verifies the certificate against the host name (httpcore passes the name, not the address, as
server_hostname).

Send time: ToolServer.credentials (headers, query parameters split off the URL at registration)
are added to each request, so no URL we store, show or log carries them.

An injected inner transport (tests' fault proxies, the simulation's in-process servers) is the
caller's own network: it gets the credentials, and the syntax checks, but opens no sockets of ours.
"""

from __future__ import annotations

import typing
from typing import Any

import httpcore
import httpx

from adapters.deadline import deadline_backend
from toolops.services.url_policy import (
    SCHEMES,
    UrlRefused,
    addresses_check,
    allowed_hosts,
    host_addresses,
    host_check,
)


class PolicyNetworkBackend(httpcore.NetworkBackend):
    """Opens TCP connections only to addresses the server URL policy allows."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
        socket_options: typing.Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        try:
            addresses = host_addresses(host, port)
            addresses_check(host, addresses, allowed=allowed_hosts())
        except UrlRefused as exc:
            # A connect error to httpx: nothing was sent, the adapters' taxonomy holds.
            raise httpcore.ConnectError(f"refused by the server URL policy: {exc}") from exc
        last: Exception | None = None
        for addr in addresses:
            try:
                return self._inner.connect_tcp(str(addr), port, timeout=timeout,
                                               local_address=local_address,
                                               socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout, OSError) as exc:
                last = exc
        assert last is not None
        raise last

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: typing.Iterable[Any] | None = None) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("unix sockets are outside the server URL policy")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _policy_http_transport() -> httpx.HTTPTransport:
    transport = httpx.HTTPTransport()
    # httpx builds its httpcore pool without a backend parameter; ours replaces the default one.
    # The adapters' per-request deadline wraps it: a transport handed to an adapter is left alone
    # by the adapter, so the socket-level deadline must be installed here.
    transport._pool._network_backend = deadline_backend(PolicyNetworkBackend())
    return transport


class ServerTransport(httpx.BaseTransport):
    """Credentials on every request; the URL policy on every connection (see the module doc)."""

    def __init__(self, *, credentials: dict[str, Any] | None = None,
                 inner: httpx.BaseTransport | None = None) -> None:
        creds = credentials or {}
        self._headers = {str(k): str(v) for k, v in (creds.get("headers") or {}).items()}
        self._query = {str(k): str(v) for k, v in (creds.get("query") or {}).items()}
        self._owned = inner is None
        self._inner = inner if inner is not None else _policy_http_transport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme not in SCHEMES:
            raise httpx.UnsupportedProtocol(f"scheme {request.url.scheme!r} is not allowed")
        try:
            host_check(request.url.host)
        except UrlRefused as exc:
            raise httpx.ConnectError(f"refused by the server URL policy: {exc}", request=request) from exc
        for name, value in self._headers.items():
            request.headers[name] = value
        if self._query:
            request.url = request.url.copy_merge_params(self._query)
        return self._inner.handle_request(request)

    def close(self) -> None:
        if self._owned:
            self._inner.close()


def server_transport(*, credentials: dict[str, Any] | None = None,
                     inner: httpx.BaseTransport | None = None) -> ServerTransport:
    return ServerTransport(credentials=credentials, inner=inner)


__all__ = ["PolicyNetworkBackend", "ServerTransport", "server_transport"]
