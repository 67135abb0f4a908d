"""Running the scriptable peers (status_server, status_server_ext): one way to serve a handler,
in a test's thread or as its own process. Standard library only, importable without Django."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# What both scriptable servers end a task with, and the one input schema their questions ask.
TERMINAL = frozenset({"completed", "failed", "cancelled"})
SCHEMA = {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]}


def serve_handler(handler: type[BaseHTTPRequestHandler], *, port: int) -> ThreadingHTTPServer:
    """A threaded HTTP server on loopback (port 0: any free one); its request threads are daemons
    so a test that ends with a stream still open does not wait for it."""
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    return server


@contextmanager
def serving_in_thread(server: ThreadingHTTPServer) -> Iterator[str]:
    """Serve `server` on a daemon thread; yields its base URL, shuts it down on exit."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def serve_main(handler: type[BaseHTTPRequestHandler]) -> None:
    """`python -m tests.peers.<server> --port N`: serve until killed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    serve_handler(handler, port=args.port).serve_forever()
