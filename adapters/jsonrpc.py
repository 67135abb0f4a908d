"""JSON-RPC over Streamable HTTP: one POST per message, answered with JSON or SSE.

This module knows HTTP and JSON-RPC framing only; it does not know MCP methods. It turns
transport outcomes into the error taxonomy by one rule: an error is transient only when
the request cannot have reached the server (or the server said "later" with 429/503);
anything that failed after the bytes left is a lost response, because for tools/call
that means "maybe created" (mcp-tasks.md section 5.1). JSON-RPC error bodies are returned
to the caller unclassified: what a code means depends on the method (section 5.3).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
from httpx._exceptions import request_context

from adapters import decode, limits
from adapters.base import RequestGate
from adapters.deadline import install_deadline, request_deadline
from adapters.errors import (
    AdapterError,
    LostResponseError,
    ProtocolViolationError,
    SessionLostError,
    TransientError,
)
from adapters.jsonrpc_frames import (
    Message,
    RpcReply,
    SseParser,
    message_kind,
    parse_retry_after,
)

ACCEPT = "application/json, text/event-stream"
SESSION_HEADER = "Mcp-Session-Id"
# A client posts to its endpoint and, rarely, to a URL the server named; more than this many
# distinct URLs is not a pattern worth keeping them for, so the rest are parsed each time.
_PARSED_URLS_KEPT = 16
# Requests that change nothing on the server: one that misses its deadline is simply retried
# later (TransientError). Any other request may have acted: LostResponseError.
READ_ONLY_METHODS = frozenset({"tasks/get", "tasks/result", "tasks/list", "tools/list", "server/discover"})


def _deadline_passed(at: float | None) -> bool:
    # This module's clock: the simulation replaces this module's `time` with a virtual one.
    return at is not None and time.monotonic() >= at


def _decode_json(text: str | bytes, *, what: str) -> Any:
    """Parsed and checked whole (depth, string content, number range): see adapters.decode."""
    return decode.json_loads(text, what=what)


def deadline_error(method: str, detail: dict[str, Any]) -> AdapterError:
    """The request deadline passed before the whole answer was read."""
    cls = TransientError if method in READ_ONLY_METHODS else LostResponseError
    return cls(f"{method}: no complete answer within the request deadline",
               detail={**detail, "deadline": True})


@contextlib.contextmanager
def _transport_errors(method: str, detail: dict[str, Any], deadline: float | None = None) -> Iterator[None]:
    """httpx failures -> taxonomy, by whether the request can have reached the server."""
    try:
        with request_deadline(deadline):
            yield
    except httpx.TimeoutException as exc:
        if _deadline_passed(deadline):
            raise deadline_error(method, detail) from exc
        if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
            raise TransientError(f"{method}: connection failed: {type(exc).__name__}", detail=detail) from exc
        raise LostResponseError(
            f"{method}: sent, but no answer was read: {type(exc).__name__}", detail=detail
        ) from exc
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
        # Nothing was written to a server socket: safe to retry, even for tools/call.
        raise TransientError(f"{method}: connection failed: {type(exc).__name__}", detail=detail) from exc
    except (httpx.UnsupportedProtocol, httpx.LocalProtocolError) as exc:
        raise AdapterError(f"{method}: request could not be sent: {exc}", detail=detail) from exc
    except httpx.TransportError as exc:
        raise LostResponseError(
            f"{method}: sent, but no answer was read: {type(exc).__name__}", detail=detail
        ) from exc


def _json_bytes(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


class JsonRpcClient:
    """Sends JSON-RPC messages to one Streamable HTTP endpoint. Thread-safe for requests."""

    def __init__(
        self,
        *,
        url: str,
        timeout_s: float,
        max_response_bytes: int,
        transport: httpx.BaseTransport | None = None,
        request_deadline_s: float | None = None,
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s  # httpx's, per read
        # Wall-clock bound of one whole exchange (headers and every body byte, SSE included).
        self.request_deadline_s = request_deadline_s or limits.DEFAULT_REQUEST_DEADLINE_S
        self.max_response_bytes = max_response_bytes
        # Protocol headers set by the shape adapter (session id, protocol version).
        self.headers: dict[str, str] = {}
        self._transport = transport
        self._client = httpx.Client(transport=transport, timeout=timeout_s, follow_redirects=False)
        if transport is None:
            install_deadline(self._client)
        # The client's own headers (User-Agent, Accept-Encoding...), lower-cased once: _post merges
        # them with each request's instead of httpx.Client doing it per request.
        self._default_headers = {k.lower(): v for k, v in self._client.headers.items()}
        self._default_timeout = httpx.Timeout(timeout_s).as_dict()
        # Parsed request URLs by their text: httpx.Request parses a str URL on every request
        # (about a twentieth of a poll's CPU), and takes a parsed httpx.URL as it is. URLs are
        # immutable, so the poll threads sharing this client can share them.
        self._parsed_urls: dict[str, httpx.URL] = {}
        # The request headers as httpx holds them, with the headers they were built from
        # (_request_headers: they change when a session opens, or per request in a subclass that
        # routes by method): httpx encodes and checks every header of a plain dict on every
        # request, and only copies an httpx.Headers.
        self._built_headers: tuple[tuple[tuple[str, str], ...], httpx.Headers] | None = None
        # Ids must be unique across every client sharing one MCP session (several workers):
        # mcp 1.30 routes a stream's messages by request id, so a collision would cross streams.
        self._id_prefix = secrets.token_hex(6)
        self._counter = 0
        self._lock = threading.Lock()
        # Passed before every request this client sends (see adapters.base.RequestGate).
        self.request_gate: RequestGate | None = None

    def new_id(self) -> str:
        with self._lock:
            self._counter += 1
            return f"{self._id_prefix}-{self._counter}"

    def clone(self) -> JsonRpcClient:
        """Same endpoint and headers, own connection pool (a stream may outlive this client)."""
        twin = JsonRpcClient(
            url=self.url,
            timeout_s=self.timeout_s,
            max_response_bytes=self.max_response_bytes,
            transport=self._transport,
            request_deadline_s=self.request_deadline_s,
        )
        twin.headers = dict(self.headers)
        twin.request_gate = self.request_gate
        return twin

    def close(self) -> None:
        # A transport passed in belongs to the caller (and may be shared with clones).
        if self._transport is None:
            self._client.close()

    def gate(self, what: str) -> None:
        """Pass the request gate (if any) before sending: it may wait, or raise TransientError."""
        if self.request_gate is not None:
            self.request_gate(what)

    def _request_headers(self) -> dict[str, str]:
        return {"Accept": ACCEPT, "Content-Type": "application/json", **self.headers}

    @contextlib.contextmanager
    def _post(self, url: str, body: Any, *, timeout: httpx.Timeout | None = None) -> Iterator[httpx.Response]:
        """POST `body` as JSON; yield the response with its body unread, closed on exit.

        This is `httpx.Client.stream("POST", ...)` without the client's per-request machinery,
        which cost about as much CPU as the exchange itself on a fast server: URL and header
        merging, the auth and redirect loops, and a pass through the cookie jar (urllib's
        cookie policy) on every response. None of it is needed. Redirects are never followed,
        credentials are added by the transport, and cookies are still kept and sent: a
        response that sets one goes through the jar, and a jar that holds any adds them.
        The transport is the one the client would choose, including proxy mounts from the
        environment. `request_context` and `_transport_for_url` are httpx internals (pinned
        0.28.1): tests/adapters/test_jsonrpc_send.py fails if the request drifts from the client's."""
        protocol = tuple(self._request_headers().items())
        built = self._built_headers
        if built is None or built[0] != protocol:
            merged = dict(self._default_headers)
            for name, value in protocol:
                merged[name.lower()] = value
            built = self._built_headers = (protocol, httpx.Headers(merged))
        headers = built[1]
        # The bytes httpx's `json=` would send (its 0.28 encoding).
        content = _json_bytes(body)
        parsed = self._parsed_urls.get(url)
        if parsed is None:
            parsed = httpx.URL(url)
            if len(self._parsed_urls) < _PARSED_URLS_KEPT:
                self._parsed_urls[url] = parsed
        request = httpx.Request("POST", parsed, headers=headers, content=content, extensions={
            "timeout": timeout.as_dict() if timeout is not None else self._default_timeout})
        jar = self._client.cookies
        if jar.jar:
            jar.set_cookie_header(request)
        transport = self._client._transport_for_url(request.url)
        with request_context(request=request):
            response = transport.handle_request(request)
        try:
            response.request = request
            if "set-cookie" in response.headers:
                jar.extract_cookies(response)
            yield response
        finally:
            response.close()

    def call(
        self, *, method: str, params: dict[str, Any], timeout_s: float | None = None, creates: bool = False
    ) -> RpcReply:
        """Send a request and return its response; server messages seen meanwhile are in `others`.

        `timeout_s` (default: the request deadline) bounds the whole exchange: httpx's timeouts
        are per read, and a reply that trickles bytes would otherwise never time out."""
        others: list[Message] = []
        budget = timeout_s if timeout_s is not None else self.request_deadline_s
        reply = self.exchange(
            method=method,
            params=params,
            request_id=self.new_id(),
            timeout=httpx.Timeout(min(budget, self.timeout_s) if timeout_s is None else budget),
            creates=creates,
            on_message=others.append,
            deadline=time.monotonic() + budget,
        )
        return dataclasses.replace(reply, others=tuple(others))

    def exchange(
        self,
        *,
        method: str,
        params: dict[str, Any],
        request_id: str,
        timeout: httpx.Timeout,
        creates: bool,
        on_message: Callable[[Message], None],
        on_open: Callable[[httpx.Response], None] | None = None,
        deadline: float | None = None,
        gated: bool = False,
    ) -> RpcReply:
        """`gated`: the caller already passed the request gate for this request (a stream opened
        on a reader thread passes it on the thread that asked for the stream)."""
        if not gated:
            self.gate(method)
        body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        detail: dict[str, Any] = {"method": method, "request_id": request_id}
        with _transport_errors(method, detail, deadline):
            with self._post(self.url, body, timeout=timeout) as response:
                if on_open is not None:
                    on_open(response)
                detail["http_status"] = response.status_code
                return self._read_reply(
                    response,
                    request_id=request_id,
                    method=method,
                    detail=detail,
                    creates=creates,
                    on_message=on_message,
                    deadline=deadline,
                )

    def post_json(self, *, url: str, body: dict[str, Any], what: str) -> httpx.Response:
        """A plain JSON POST with this client's protocol headers (a server's side endpoint)."""
        detail: dict[str, Any] = {"method": what}
        self.gate(what)
        deadline = time.monotonic() + self.request_deadline_s
        with _transport_errors(what, detail, deadline):
            with self._post(url, body) as response:
                raw = b"".join(self._body_chunks(response, detail=detail, deadline=deadline, method=what))
        return httpx.Response(response.status_code, headers=response.headers, content=raw,
                              request=response.request)

    def post_message(self, *, message: Message, what: str) -> None:
        """POST a notification or a response to a server request; the server answers 202."""
        detail: dict[str, Any] = {"method": what}
        self.gate(what)
        deadline = time.monotonic() + self.request_deadline_s
        with _transport_errors(what, detail, deadline):
            with self._post(self.url, message) as response:
                detail["http_status"] = response.status_code
                if response.status_code in (200, 202, 204):
                    return
                error = self._best_effort_error(response, deadline=deadline)
                self._raise_for_status(response, detail=detail, creates=False, body=error)
        raise AdapterError(f"{what}: HTTP {response.status_code}", detail=detail)

    def _best_effort_error(self, response: httpx.Response, *, deadline: float | None = None
                           ) -> dict[str, Any] | None:
        """The JSON-RPC error in an HTTP error reply, if it has one within the size limit."""
        try:
            raw = b"".join(self._body_chunks(response, detail={}, deadline=deadline, method="error body"))
            parsed = _decode_json(raw, what="error body") if raw.lstrip().startswith(b"{") else None
        except (httpx.HTTPError, ProtocolViolationError, TransientError, LostResponseError):
            return None
        error = parsed.get("error") if isinstance(parsed, dict) else None
        return error if isinstance(error, dict) else None

    def _body_chunks(self, response: httpx.Response, *, detail: dict[str, Any], deadline: float | None,
                     method: str) -> Iterator[bytes]:
        """The body as it arrives, never more than max_response_bytes of it, never past the
        deadline (also checked here for transports without the deadline backend)."""
        limit = {**detail, "violation": "response body over the size limit",
                 "max_response_bytes": self.max_response_bytes}
        length = response.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_response_bytes:
            raise ProtocolViolationError("response body over the size limit", detail=limit)
        seen = 0
        for chunk in response.iter_bytes():
            if _deadline_passed(deadline):
                raise deadline_error(method, detail)
            seen += len(chunk)
            if seen > self.max_response_bytes:
                raise ProtocolViolationError("response body over the size limit", detail=limit)
            yield chunk

    def _raise_for_status(
        self, response: httpx.Response, *, detail: dict[str, Any], creates: bool, body: dict[str, Any] | None
    ) -> None:
        """HTTP outcomes that outrank the body: a lost session and explicit back-pressure."""
        status = response.status_code
        if body is not None:
            detail.update(jsonrpc_code=body.get("code"), jsonrpc_message=body.get("message"))
        if status == 404 and any(k.lower() == SESSION_HEADER.lower() for k in self.headers):
            raise SessionLostError("MCP session is gone (HTTP 404)", detail=detail)
        if status in (429, 503):
            retry_after = parse_retry_after(response.headers.get("retry-after"))
            detail["retry_after"] = retry_after
            raise TransientError(
                f"server asked to retry later (HTTP {status})", detail=detail, retry_after=retry_after
            )
        if status >= 500 and body is None:
            # For a creating call a 500/502/504 may come after the server acted on it.
            cls = LostResponseError if creates else TransientError
            raise cls(f"HTTP {status} without a JSON-RPC answer", detail=detail)

    def _read_reply(
        self,
        response: httpx.Response,
        *,
        request_id: str,
        method: str,
        detail: dict[str, Any],
        creates: bool,
        on_message: Callable[[Message], None],
        deadline: float | None,
    ) -> RpcReply:
        status = response.status_code
        if 300 <= status < 400:
            # Redirects are never followed: the request would be re-sent to a place we did not choose.
            raise ProtocolViolationError(f"{method}: HTTP {status} redirect is not followed",
                                         detail={**detail, "violation": "redirect"})
        if status >= 400 or status in (204, 202):
            error = self._best_effort_error(response, deadline=deadline) if status >= 400 else None
            self._raise_for_status(response, detail=detail, creates=creates, body=error)
            if error is None:
                raise AdapterError(f"{method}: HTTP {status} without a JSON-RPC answer", detail=detail)
            # e.g. 400 "Missing session ID": mcp 1.30 answers with id "server-error", so an
            # HTTP error reply's JSON-RPC error is ours whatever its id says.
            return self._reply(method, {"jsonrpc": "2.0", "id": request_id, "error": error}, response)
        content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type == "application/json":
            body = self._body_chunks(response, detail=detail, deadline=deadline, method=method)
            message = _decode_json(b"".join(body), what=method)
            if self._is_our_response(message, request_id, detail=detail):
                return self._reply(method, message, response)
            raise ProtocolViolationError(f"{method}: JSON reply is not a response", detail=detail)
        if content_type != "text/event-stream":
            raise ProtocolViolationError(f"{method}: unexpected content type {content_type!r}", detail=detail)
        parser = SseParser()
        for chunk in self._body_chunks(response, detail=detail, deadline=deadline, method=method):
            for event, data in parser.feed(chunk):
                if event != "message":
                    continue
                message = _decode_json(data, what=f"{method} SSE event")
                if self._is_our_response(message, request_id, detail=detail):
                    return self._reply(method, message, response)
                on_message(message)
        # Clean end of stream before our response (truncated or dropped by the server).
        raise LostResponseError(f"{method}: stream ended before the response", detail=detail)

    @staticmethod
    def _is_our_response(message: Any, request_id: str, *, detail: dict[str, Any]) -> bool:
        kind = message_kind(message)
        if kind in ("request", "notification"):
            return False
        if message.get("id") == request_id or (kind == "error" and message.get("id") is None):
            return True
        got = str(message.get("id"))[:80]
        raise ProtocolViolationError("response carries another JSON-RPC id", detail={**detail, "got_id": got})

    @staticmethod
    def _reply(method: str, message: Message, response: httpx.Response) -> RpcReply:
        return RpcReply(
            method=method,
            message=message,
            result=message.get("result"),
            error=message.get("error"),
            http_status=response.status_code,
            session_id=response.headers.get(SESSION_HEADER),
            others=(),
        )
