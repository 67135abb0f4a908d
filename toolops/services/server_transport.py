"""The httpx transport every adapter talks through: the URL policy at connect time, credentials
added at send time.

Connect time: the HTTP/1.1 transport (adapters/http11.py) opens sockets through `policy_connect`,
which resolves the host itself, checks every address with the server URL policy
(toolops/services/url_policy.py) and connects to an address it checked. The name is never
resolved twice between check and connect, so a DNS answer that changes after registration
(rebinding) cannot reach a refused address. TLS still verifies the certificate against the host
name (the transport passes the name, not the address, as server_hostname).

Send time: ToolServer.credentials (headers, query parameters split off the URL at registration)
are added to each request, so no URL we store, show or log carries them.

An injected inner transport (tests' fault proxies, the simulation's in-process servers) is the
caller's own network: it gets the credentials, and the syntax checks, but opens no sockets of ours.
"""

from __future__ import annotations

import socket
from typing import Any

import httpx

from adapters.http11 import Http11Transport, tcp_connect
from toolops.services.url_policy import (
    SCHEMES,
    UrlRefused,
    addresses_check,
    allowed_hosts,
    host_addresses,
    host_check,
)


def policy_connect(host: str, port: int, timeout: float | None) -> socket.socket:
    """A TCP socket to an address of `host` that the server URL policy allows."""
    try:
        addresses = host_addresses(host, port)
        addresses_check(host, addresses, allowed=allowed_hosts())
    except UrlRefused as exc:
        # A connect error to httpx: nothing was sent, the adapters' taxonomy holds.
        raise httpx.ConnectError(f"refused by the server URL policy: {exc}") from exc
    last: Exception | None = None
    for addr in addresses:
        try:
            # The checked address, never the name: resolving again could answer differently.
            return tcp_connect(str(addr), port, timeout)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            last = exc
    assert last is not None
    raise last


class ServerTransport(httpx.BaseTransport):
    """Credentials on every request; the URL policy on every connection (see the module doc)."""

    def __init__(self, *, credentials: dict[str, Any] | None = None,
                 inner: httpx.BaseTransport | None = None) -> None:
        creds = credentials or {}
        self._headers = {str(k): str(v) for k, v in (creds.get("headers") or {}).items()}
        self._query = {str(k): str(v) for k, v in (creds.get("query") or {}).items()}
        self._owned = inner is None
        self._inner = inner if inner is not None else Http11Transport(connect=policy_connect)

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


__all__ = ["ServerTransport", "policy_connect", "server_transport"]
