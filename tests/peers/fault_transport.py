"""An httpx transport in front of a real peer: injects HTTP faults and holds replies on demand.

Everything not injected goes over real HTTP to the peer. Used to make the server answer 429/503
(with or without Retry-After) to chosen JSON-RPC methods, and to delay one reply so that two
pollers' answers arrive out of order. Importable without Django.

`script(Rule(...))` is the scriptable layer: a rule matches on JSON-RPC method and/or
task id and the n-th matching request, and acts on it: drop the answer after the server processed
the request, truncate the body, replace the status (429/503 + Retry-After), delay, rewrite the
reply JSON, or hold the reply until the test releases it. Rules are checked in order; the first
that matches and still has firings left acts, everything else passes through untouched.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Fault:
    method: str
    status: int
    headers: dict[str, str] = field(default_factory=dict)


ACTIONS = frozenset({"drop", "truncate", "status", "delay", "rewrite", "hold"})


@dataclass
class Rule:
    action: str
    method: str | None = None
    task_id: str | None = None
    # 1-based among the requests this rule matched; None: from the first match on.
    nth: int | None = None
    times: int = 1
    status: int = 503
    headers: dict[str, str] = field(default_factory=dict)
    # "status" only: forward the request first (the server acted) or answer in its place.
    forward: bool = False
    delay_s: float = 0.0
    # "rewrite", "hold", "delay": gets the JSON-RPC response message, returns the one delivered.
    rewrite: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # Messages the server "pushed" on the reply stream before the response (e.g. a replayed
    # server request); the reply becomes an SSE stream.
    prepend: list[dict[str, Any]] = field(default_factory=list)
    seen: int = 0
    fired: int = 0
    held: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown action {self.action!r}; known: {sorted(ACTIONS)}")

    def release(self) -> None:
        self.released.set()

    def wait_held(self, timeout_s: float = 30.0) -> bool:
        return self.held.wait(timeout_s)


def _request_info(content: bytes) -> tuple[str, str | None, Any]:
    try:
        body = json.loads(content or b"{}")
    except ValueError:
        return "", None, None
    if not isinstance(body, dict):
        return "", None, None
    params = body.get("params")
    task_id = params.get("taskId") if isinstance(params, dict) else None
    return str(body.get("method", "")), task_id if isinstance(task_id, str) else None, body.get("id")


def _rewrite_body(body: str, *, json_ct: bool, rpc_id: Any,
                  fn: Callable[[dict[str, Any]], dict[str, Any]]) -> str:
    """Apply `fn` to the response message answering `rpc_id` (JSON body or SSE data lines)."""
    if json_ct:
        return json.dumps(fn(json.loads(body)))
    out = []
    for line in body.split("\n"):
        if line.startswith("data:"):
            try:
                message = json.loads(line[5:].strip())
            except ValueError:
                message = None
            if isinstance(message, dict) and message.get("id") == rpc_id and "method" not in message:
                line = f"data: {json.dumps(fn(message))}"
        out.append(line)
    return "\n".join(out)


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
        self._rules: list[Rule] = []
        # (method, task id, http status) of every request that reached the peer.
        self.log: list[tuple[str, str | None, int]] = []

    def script(self, rule: Rule) -> Rule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def _rule_for(self, method: str, task_id: str | None) -> Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.method is not None and rule.method != method:
                    continue
                if rule.task_id is not None and rule.task_id != task_id:
                    continue
                rule.seen += 1
                if rule.fired >= rule.times or (rule.nth is not None and rule.seen < rule.nth):
                    continue
                rule.fired += 1
                return rule
        return None

    def _apply(self, rule: Rule, request: httpx.Request, rpc_id: Any) -> httpx.Response:
        if rule.action == "status" and not rule.forward:
            return httpx.Response(rule.status, headers=rule.headers, request=request, content=b"")
        if rule.action == "delay":
            time.sleep(rule.delay_s)
        response = self._inner.handle_request(request)
        body = response.read()
        response.close()
        headers = {k: v for k, v in response.headers.items()
                   if k.lower() not in ("content-length", "content-encoding", "transfer-encoding")}
        if rule.action == "drop":
            # The server has processed the request and answered; the answer never reaches us.
            raise httpx.ReadTimeout("fault layer dropped the answer", request=request)
        if rule.action == "truncate":
            body = body[: len(body) // 2]
        elif rule.action == "status":
            return httpx.Response(rule.status, headers=rule.headers, request=request, content=b"")
        json_ct = headers.get("content-type", "").startswith("application/json")
        if rule.rewrite is not None:
            body = _rewrite_body(body.decode(), json_ct=json_ct, rpc_id=rpc_id,
                                 fn=rule.rewrite).encode()
        if rule.prepend:
            text = body.decode()
            if json_ct:
                text = f"event: message\ndata: {text}\n\n"
            pushed = "".join(f"event: message\ndata: {json.dumps(m)}\n\n" for m in rule.prepend)
            body = (pushed + text).encode()
            headers = {**{k: v for k, v in headers.items() if k.lower() != "content-type"},
                       "content-type": "text/event-stream"}
        if rule.action == "hold":
            rule.held.set()
            rule.released.wait(60.0)
        return httpx.Response(response.status_code, headers=headers, request=request,
                              content=body)

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
        method, task_id, rpc_id = _request_info(request.read())
        rule = self._rule_for(method, task_id) if method else None
        if rule is not None:
            with self._lock:
                self.methods.append(method)
            try:
                reply = self._apply(rule, request, rpc_id)
            except httpx.TransportError:
                with self._lock:
                    self.log.append((method, task_id, 0))  # 0: the answer never arrived
                raise
            with self._lock:
                self.log.append((method, task_id, reply.status_code))
            return reply
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
            self.log.append((method, task_id, response.status_code))
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


class DropToolsCall(httpx.BaseTransport):
    """Fault proxy for tools/call: `forward=True` lets the server act and then loses the answer;
    `forward=False` loses the request itself. Every other request passes through untouched."""

    def __init__(self, *, forward: bool, times: int = 1) -> None:
        self.inner = httpx.HTTPTransport()
        self.forward = forward
        self.remaining = times

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        is_call = (request.method == "POST" and body[:1] == b"{"
                   and json.loads(body).get("method") == "tools/call")
        if is_call and self.remaining > 0:
            self.remaining -= 1
            if self.forward:
                response = self.inner.handle_request(request)
                response.read()  # the server has answered: the task exists
                response.close()
            raise httpx.ReadTimeout("fault proxy dropped the tools/call answer", request=request)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()
