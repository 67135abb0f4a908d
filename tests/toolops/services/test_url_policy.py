"""The server URL policy: schemes, allow-list, refused address classes and numeric forms, checks
after resolution and again at connect time (DNS rebinding), no redirects, credentials kept out of
the stored URL and never shown; server-add against a hostile descriptor is one line."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings

from ledger.models import ToolServer
from tests.toolops.api_fixtures import principal
from toolops.services import url_policy
from toolops.services.server_transport import server_transport
from toolops.services.servers import server_add
from toolops.services.url_policy import UrlRefused, url_check, url_split_credentials

LOOPBACK_OK = "public,127.0.0.0/8,::1"


@pytest.mark.parametrize("url", [
    "ftp://example.com/", "file:///etc/passwd", "gopher://example.com/", "http:///nohost",
    "http://0.0.0.0/", "http://[::]/", "http://0.1.2.3/",
    "http://2130706433/", "http://127.1/", "http://0x7f.1/", "http://0x7f000001/",
    "http://0177.0.0.1/", "http://127.000.000.001/", "http://1.2.3.4.5/",
    "http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/", "http://[fe80::1]/",
    "http://[::ffff:169.254.169.254]/", "http://[::ffff:127.0.0.1]/", "http://224.0.0.1/",
    "http://10.0.0.1/", "http://192.168.1.1/", "http://127.0.0.1:8000/mcp", "http://[::1]/",
])
@override_settings(TOOLOPS_SERVER_HOSTS="public")
def test_refused(url: str) -> None:
    with pytest.raises(UrlRefused):
        url_check(url, resolve=False)


@override_settings(TOOLOPS_SERVER_HOSTS="public")
def test_public_literal_allowed_and_private_only_when_listed() -> None:
    url_check("http://93.184.216.34/mcp", resolve=False)
    url_check("https://[2606:2800:220:1::]/", resolve=False)
    with override_settings(TOOLOPS_SERVER_HOSTS="10.0.0.0/8"):
        url_check("http://10.1.2.3/", resolve=False)
        with pytest.raises(UrlRefused):  # "public" is not listed any more
            url_check("http://93.184.216.34/", resolve=False)
    with override_settings(TOOLOPS_SERVER_HOSTS=LOOPBACK_OK):
        url_check("http://127.0.0.1:8000/mcp", resolve=False)
        # Listing loopback never opens the always-refused classes.
        for url in ("http://169.254.169.254/", "http://0.0.0.0/", "http://2130706433/"):
            with pytest.raises(UrlRefused):
                url_check(url, resolve=False)


@override_settings(TOOLOPS_SERVER_HOSTS="public,tools.internal")
def test_checked_after_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {"evil.example": "169.254.169.254", "loop.example": "127.0.0.1",
               "ok.example": "93.184.216.34", "tools.internal": "10.9.8.7"}

    def fake_getaddrinfo(host: str, port: int, *a: Any, **k: Any) -> list[Any]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], port))]

    monkeypatch.setattr(url_policy.socket, "getaddrinfo", fake_getaddrinfo)
    for host in ("evil.example", "loop.example"):
        with pytest.raises(UrlRefused, match="refused"):
            url_check(f"http://{host}/")
    url_check("http://ok.example/")
    url_check("http://tools.internal/")  # a listed name may resolve to a private address


def test_credentials_are_split_off_the_url() -> None:
    clean, creds = url_split_credentials(
        "HTTP://user:p%40ss@Example.COM:8443/mcp?tenant=a&token=t0k&API-Key=k1&access_token=z")
    assert clean == "http://example.com:8443/mcp?tenant=a"
    assert creds["headers"]["Authorization"].startswith("Basic ")
    assert creds["query"] == {"token": "t0k", "API-Key": "k1", "access_token": "z"}
    assert url_split_credentials("https://example.com/mcp") == ("https://example.com/mcp", {})


class _Recorder(BaseHTTPRequestHandler):
    """Records every request; answers as `script` says (status, headers, JSON body)."""

    seen: list[dict[str, Any]]
    script: Any

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        message = json.loads(body or b"{}")
        self.seen.append({"path": self.path, "headers": dict(self.headers), "message": message})
        status, headers, reply = self.script(message)
        payload = b"" if reply is None else json.dumps(reply).encode()
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", **headers}.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST

    def log_message(self, *args: Any) -> None:
        return


def _serve(script: Any) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []
    handler = type("H", (_Recorder,), {"seen": seen, "script": staticmethod(script)})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def _mcp(tools: list[dict[str, Any]]) -> Any:
    def script(message: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        method = message.get("method")
        if method == "initialize":
            return 200, {"Mcp-Session-Id": "s1"}, {"jsonrpc": "2.0", "id": message["id"], "result": {
                "protocolVersion": "2025-11-25", "serverInfo": {"name": "rec", "version": "1"},
                "capabilities": {"tasks": {"requests": {"tools": {"call": {}}}}}}}
        if "id" not in message:
            return 202, {}, None
        return 200, {}, {"jsonrpc": "2.0", "id": message["id"], "result": {"tools": tools}}
    return script


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    yield from _serve(_mcp([{"name": "render", "inputSchema": {"type": "object"},
                             "execution": {"taskSupport": "optional"}}]))


@pytest.mark.django_db
def test_credentials_sent_on_every_request_never_stored_or_shown(recorder: Any) -> None:
    base, seen = recorder
    server = server_add(name="cred", url=f"http://ops:s3cr3t-pw@{base[7:]}/mcp?token=t0k-123&v=2")
    assert server.url == f"{base}/mcp?v=2"
    assert server.credentials["query"] == {"token": "t0k-123"}
    assert seen and all(r["headers"].get("Authorization", "").startswith("Basic ") for r in seen)
    assert all("token=t0k-123" in r["path"] for r in seen)
    # Shown nowhere: REST (to a tenant of the shared server), admin, the CLI's printed object.
    listing = principal(username="t", org="acme").get("/api/servers/").content.decode()
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
    page = admin.get(f"/admin/ledger/toolserver/{server.pk}/change/").content.decode()
    out = StringIO()
    call_command("toolops", "server-add", "cred2", "--url",
                 f"http://ops:s3cr3t-pw@{base[7:]}/mcp?token=t0k-123", stdout=out)
    for shown in (listing, page, out.getvalue()):
        assert "s3cr3t-pw" not in shown and "t0k-123" not in shown
        assert "Basic " not in shown


@pytest.mark.django_db
@override_settings(TOOLOPS_SERVER_HOSTS="public")
def test_refused_registration_contacts_nothing_and_prints_one_line(recorder: Any) -> None:
    base, seen = recorder
    for url in (f"{base}/mcp", "http://169.254.169.254/", "http://2130706433/", "ftp://x/"):
        with pytest.raises(CommandError) as refused:
            call_command("toolops", "server-add", "nope", "--url", url)
        assert "\n" not in str(refused.value)
    assert seen == [] and not ToolServer.objects.exists()


@pytest.mark.django_db
def test_dns_rebinding_is_refused_at_connect_time(monkeypatch: pytest.MonkeyPatch,
                                                  recorder: Any) -> None:
    """The name passes at registration (public), then resolves to loopback when connected."""
    base, seen = recorder
    port = int(base.rsplit(":", 1)[1])
    calls: list[str] = []
    real = socket.getaddrinfo

    def rebinding(host: str, p: int, *a: Any, **k: Any) -> list[Any]:
        if host != "rebind.example":
            return real(host, p, *a, **k)
        calls.append(host)
        addr = "93.184.216.34" if len(calls) == 1 else "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (addr, p))]

    monkeypatch.setattr(url_policy.socket, "getaddrinfo", rebinding)
    with override_settings(TOOLOPS_SERVER_HOSTS="public"), pytest.raises(CommandError) as refused:
        call_command("toolops", "server-add", "rb", "--url", f"http://rebind.example:{port}/mcp")
    # The connect was refused before any socket opened (the adapter reports a connect failure).
    assert "connection failed: ConnectError" in str(refused.value)
    assert len(calls) >= 2 and seen == [] and not ToolServer.objects.exists()


def test_transport_checks_every_connection_and_never_follows_redirects() -> None:
    for target, target_seen in _serve(lambda m: (200, {}, {"ok": True})):
        for base, seen in _serve(lambda m, t=target: (307, {"Location": f"{t}/next"}, None)):
            with override_settings(TOOLOPS_SERVER_HOSTS="public"):
                with httpx.Client(transport=server_transport()) as client, \
                        pytest.raises(httpx.ConnectError, match="URL policy"):
                    client.post(f"{base}/mcp", json={})
                assert seen == []
            with override_settings(TOOLOPS_SERVER_HOSTS=LOOPBACK_OK):
                with httpx.Client(transport=server_transport(), follow_redirects=False) as client:
                    assert client.post(f"{base}/mcp", json={}).status_code == 307
                assert len(seen) == 1 and target_seen == []


@pytest.mark.django_db
def test_server_add_against_a_nul_descriptor_is_one_line() -> None:
    for base, _seen in _serve(_mcp([{"name": "evil", "description": "a\u0000b",
                                     "inputSchema": {"type": "object"},
                                     "execution": {"taskSupport": "optional"}}])):
        with pytest.raises(CommandError) as refused:
            call_command("toolops", "server-add", "evil", "--url", f"{base}/mcp")
        message = str(refused.value)
        assert "\n" not in message and ("U+0000" in message or "NUL" in message), message
        assert not ToolServer.objects.exists()


@pytest.mark.django_db
def test_a_row_stored_with_credentials_before_the_policy_is_shown_without_them() -> None:
    from tests.ledger.factories import ToolServerFactory

    ToolServerFactory(name="legacy", url="http://ops:hunter2-pw@tools.example/mcp?token=tok-old&v=1")
    listing = principal(username="t", org="acme").get("/api/servers/legacy/")
    assert listing.status_code == 200
    assert listing.json()["url"] == "http://tools.example/mcp?v=1"
