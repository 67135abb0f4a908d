"""A loopback HTTP proxy that can deliver a request and then lose the answer.

Used for "submission with a lost answer" against servers that have no such mode of their
own (the FastMCP peer): the request really reaches the upstream server and is processed,
then the proxy closes the client's connection without a byte of the response.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

HOP_HEADERS = frozenset({"host", "content-length", "connection", "transfer-encoding", "keep-alive"})


@dataclass
class DropPlan:
    """Drop the answers of the next `count` requests whose JSON-RPC method is `method`."""

    method: str = ""
    count: int = 0
    dropped: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, method: str) -> bool:
        with self.lock:
            if self.count > 0 and method == self.method:
                self.count -= 1
                self.dropped.append(method)
                return True
            return False


@contextmanager
def dropping_proxy(upstream: str) -> Iterator[tuple[str, DropPlan]]:
    """Yield (proxy URL with the upstream's path, plan)."""
    plan = DropPlan()
    target = httpx.URL(upstream)
    client = httpx.Client(timeout=30.0)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            try:
                method = str(json.loads(body).get("method", ""))
            except (ValueError, AttributeError):
                method = ""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
            answer = client.post(str(target.copy_with(path=self.path)), content=body, headers=headers)
            if plan.take(method):
                # Processed upstream; the caller never sees the answer.
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self.send_response(answer.status_code)
            for key, value in answer.headers.items():
                if key.lower() not in HOP_HEADERS and key.lower() != "content-encoding":
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(answer.content)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        yield str(target.copy_with(host="127.0.0.1", port=port)), plan
    finally:
        server.shutdown()
        server.server_close()
        client.close()
