"""An httpx transport in front of a real peer: injects HTTP faults and holds replies on demand.

Everything not injected goes over real HTTP to the peer. Used to make the server answer 429/503
(with or without Retry-After) to chosen JSON-RPC methods, and to delay one reply so that two
pollers' answers arrive out of order. Importable without Django.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx


@dataclass
class Fault:
    method: str
    status: int
    headers: dict[str, str] = field(default_factory=dict)


class FaultTransport(httpx.BaseTransport):
    def __init__(self) -> None:
        self._inner = httpx.HTTPTransport()
        self._lock = threading.Lock()
        self._faults: deque[Fault] = deque()
        self.methods: list[str] = []
        # Called with the method after the real reply was read and before it is returned:
        # a test blocks here to hold one poller's answer back.
        self.before_reply: Callable[[str], None] | None = None
        # (method, notification): the next reply to `method` becomes an SSE stream carrying the
        # notification before the real response, as a server pushing on an open stream does.
        self._pushes: deque[tuple[str, dict[str, object]]] = deque()

    def push_before_reply(self, *, method: str, notification: dict[str, object]) -> None:
        with self._lock:
            self._pushes.append((method, notification))

    def inject(self, fault: Fault, *, times: int = 1) -> None:
        with self._lock:
            self._faults.extend([fault] * times)

    def pending_faults(self) -> int:
        with self._lock:
            return len(self._faults)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            method = str(json.loads(request.content or b"{}").get("method", ""))
        except (ValueError, AttributeError):
            method = ""
        with self._lock:
            self.methods.append(method)
            fault = self._faults[0] if self._faults and self._faults[0].method == method else None
            if fault is not None:
                self._faults.popleft()
        if fault is not None:
            return httpx.Response(fault.status, headers=fault.headers, request=request,
                                  content=b"")
        response = self._inner.handle_request(request)
        with self._lock:
            push = self._pushes[0] if self._pushes and self._pushes[0][0] == method else None
            if push is not None:
                self._pushes.popleft()
        if push is not None:
            body = response.read().decode()
            if response.headers.get("content-type", "").startswith("application/json"):
                body = f"event: message\ndata: {body}\n\n"
            stream = f"event: message\ndata: {json.dumps(push[1])}\n\n{body}"
            headers = {k: v for k, v in response.headers.items()
                       if k.lower() not in ("content-length", "content-type", "content-encoding")}
            response = httpx.Response(response.status_code, request=request,
                                      headers={**headers, "content-type": "text/event-stream"},
                                      content=stream.encode())
        if self.before_reply is not None:
            response.read()
            self.before_reply(method)
        return response

    def close(self) -> None:
        self._inner.close()
