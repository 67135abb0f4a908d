"""How JsonRpcClient puts a request on the wire: straight to the transport, with what
httpx.Client.stream would have sent (headers, JSON bytes, timeouts), cookies kept, no redirects."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from adapters.errors import ProtocolViolationError
from adapters.jsonrpc import JsonRpcClient

URL = "http://peer.test/mcp"


def _client(handler: Any) -> JsonRpcClient:
    return JsonRpcClient(url=URL, timeout_s=7.0, max_response_bytes=1 << 20,
                         transport=httpx.MockTransport(handler))


def _ok(request: httpx.Request, **headers: str) -> httpx.Response:
    body = json.loads(request.content)
    return httpx.Response(200, json={"jsonrpc": "2.0", "id": body["id"], "result": {}},
                          headers=headers)


def test_the_request_is_what_httpx_client_stream_would_send() -> None:
    seen: list[httpx.Request] = []

    def peer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _ok(request)

    client = _client(peer)
    client.headers["Mcp-Session-Id"] = "s-1"
    params = {"name": "wörk", "arguments": {"n": [1, 2.5, None]}}
    client.call(method="tools/call", params=params, timeout_s=3.0)
    ours = seen[0]

    # The same request built by httpx.Client, as the client used to send it.
    reference = httpx.Client(timeout=7.0).build_request(
        "POST", URL, json=_sent_body(ours), headers=client._request_headers(), timeout=httpx.Timeout(3.0))
    assert ours.method == "POST" and ours.url == reference.url
    assert ours.content == reference.content  # the JSON bytes, byte for byte
    assert dict(ours.headers) == dict(reference.headers)
    assert ours.extensions["timeout"] == reference.extensions["timeout"]
    assert ours.headers["mcp-session-id"] == "s-1"


def _sent_body(request: httpx.Request) -> Any:
    return json.loads(request.content)


def test_a_cookie_the_server_sets_is_sent_back() -> None:
    cookies: list[str | None] = []

    def peer(request: httpx.Request) -> httpx.Response:
        cookies.append(request.headers.get("cookie"))
        return _ok(request, **({"set-cookie": "affinity=node-7; Path=/"} if len(cookies) == 1 else {}))

    client = _client(peer)
    for _ in range(3):
        client.call(method="tasks/get", params={"taskId": "t"})
    assert cookies == [None, "affinity=node-7", "affinity=node-7"]


def test_the_default_timeout_is_the_clients_per_read_timeout() -> None:
    timeouts: list[dict[str, float | None]] = []

    def peer(request: httpx.Request) -> httpx.Response:
        timeouts.append(request.extensions["timeout"])
        return httpx.Response(202)

    _client(peer).post_message(message={"jsonrpc": "2.0", "method": "notifications/initialized"},
                               what="initialized")
    assert timeouts == [httpx.Timeout(7.0).as_dict()]


def test_a_redirect_is_refused_not_followed() -> None:
    calls: list[str] = []

    def peer(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url))
        return httpx.Response(307, headers={"location": "http://elsewhere.test/mcp"})

    with pytest.raises(ProtocolViolationError, match="redirect"):
        _client(peer).call(method="tasks/get", params={"taskId": "t"})
    assert calls == [URL]


def test_the_response_is_closed_after_the_exchange() -> None:
    streams: list[httpx.ByteStream] = []

    class Tracked(httpx.ByteStream):
        closed = False

        def close(self) -> None:
            self.closed = True

    def peer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        stream = Tracked(json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": {}}).encode())
        streams.append(stream)
        return httpx.Response(200, headers={"content-type": "application/json"}, stream=stream)

    _client(peer).call(method="tasks/get", params={"taskId": "t"})
    assert len(streams) == 1 and streams[0].closed


def test_each_request_goes_to_its_own_url_however_many_a_client_has_posted_to() -> None:
    # Parsed URLs are kept for a client's few endpoints; past the bound, each is parsed again.
    urls: list[str] = []

    def peer(request: httpx.Request) -> httpx.Response:
        urls.append(str(request.url))
        return httpx.Response(200, json={})

    client = _client(peer)
    sent = [f"http://peer.test/side/{k}?q={k}" for k in range(40)] * 2
    for url in sent:
        client.post_json(url=url, body={"k": 1}, what="side")
    assert urls == sent


def test_a_changed_protocol_header_is_sent_from_the_next_request_on() -> None:
    # The built headers are kept between requests; a new session id must not be missed.
    sessions: list[str | None] = []

    def peer(request: httpx.Request) -> httpx.Response:
        sessions.append(request.headers.get("mcp-session-id"))
        return _ok(request)

    client = _client(peer)
    client.call(method="tasks/get", params={"taskId": "t"})
    client.headers["Mcp-Session-Id"] = "s-1"
    client.call(method="tasks/get", params={"taskId": "t"})
    client.call(method="tasks/get", params={"taskId": "t"})
    client.headers["Mcp-Session-Id"] = "s-2"
    client.call(method="tasks/get", params={"taskId": "t"})
    del client.headers["Mcp-Session-Id"]
    client.call(method="tasks/get", params={"taskId": "t"})
    assert sessions == [None, "s-1", "s-1", "s-2", None]
