"""A scriptable MCP 2025-11-25 task server: each call states the statuses it will report.

For the conformance cells the official SDK server cannot be told to produce (a create reply that
is already `completed`, a `tasks/cancel` answered with a `working` task, a status the protocol
lacks). It speaks Streamable HTTP's JSON form and SSE only where the spec needs a stream
(`tasks/result` while input is pending). Standard library only.

The one tool, `scripted`, takes `{"script": {...}}`:
  create: status in the create reply (default "working")
  get:    list of statuses `tasks/get` reports in turn (the last one repeats)
  cancel: status in the `tasks/cancel` reply, or "error" for -32602 (default "cancelled")
  result: the CallToolResult `tasks/result` returns once the task is terminal
  result_errors: how many `tasks/result` reads of the terminal task fail with -32603 first
  lose_create: true: the task is created and the connection closed without the reply
  notify: {"taskId": ..., "status": ...}: every `tasks/get` of this task is answered on an SSE
          stream that first pushes that `notifications/tasks/status`
The server declares a fencing lookup by submission key (POST /lookup {"key"}, the
`io.toolops/submission-key` capability the Shape A adapter reads) on /mcp; on /mcp-nokey it
declares none, so a lost create there is resolved by an operator from `tasks/list` candidates.
A task whose current status is `input_required` has one elicitation request pending: it is
delivered on the next `tasks/result` stream, which stays open until the client sends
`notifications/cancelled` for it (as the SDK handler does), and an answer moves the script on.

Run: python -m tests.peers.status_server --port PORT (MCP endpoint /mcp).
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.peers.scripted_http import SCHEMA, TERMINAL, serve_handler, serve_main

PROTOCOL = "2025-11-25"
SUBMISSION_KEY_META = "io.toolops/submission-key"
KEY_CAPABILITY = {SUBMISSION_KEY_META: {"lookup": {"path": "/lookup", "fences": True}}}
RELATED = "io.modelcontextprotocol/related-task"


@dataclass
class Task:
    task_id: str
    script: dict[str, Any]
    status: str
    gets: list[str]
    submission_key: str = ""
    answers: list[Any] = field(default_factory=list)
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)  # request id -> request
    cancelled_streams: set[str] = field(default_factory=set)
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    def wire(self) -> dict[str, Any]:
        return {"taskId": self.task_id, "status": self.status, "createdAt": self.created,
                "lastUpdatedAt": self.created, "ttl": 60_000, "pollInterval": 100}


class State:
    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.tasks: dict[str, Task] = {}
        self.ids = itertools.count(1)
        self.log: list[str] = []

    def reset(self) -> None:
        """Forget every task (a test that reads `tasks/list` wants only its own)."""
        with self.lock:
            self.tasks.clear()

    def by_key(self, key: str) -> Task | None:
        with self.lock:
            return next((t for t in self.tasks.values() if t.submission_key == key), None)

    def ask(self, task: Task) -> None:
        """Queue the elicitation for an `input_required` task (once per round)."""
        if task.status == "input_required" and not task.pending:
            rid = f"elicit-{task.task_id}-{len(task.answers) + 1}"
            task.pending[rid] = {
                "jsonrpc": "2.0", "id": rid, "method": "elicitation/create",
                "params": {"mode": "form", "message": f"round {len(task.answers) + 1}?",
                           "requestedSchema": SCHEMA, "_meta": {RELATED: {"taskId": task.task_id}}},
            }

    def advance(self, task: Task) -> None:
        if task.status in TERMINAL:
            return
        if task.gets:
            task.status = task.gets.pop(0) if len(task.gets) > 1 else task.gets[0]
        self.ask(task)
        self.lock.notify_all()


STATE = State()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *args: Any) -> None:
        pass

    def _json(self, body: dict[str, Any] | None, status: int = 200) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Mcp-Session-Id", "status-session")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if self.path == "/lookup":
            return self._lookup(str(body.get("key")))
        method, rid, params = body.get("method"), body.get("id"), body.get("params") or {}
        with STATE.lock:
            STATE.log.append(str(method or "response"))
        if method is None:  # a response to our elicitation
            self._answer(body)
            return self._json(None, 202)
        if method == "notifications/cancelled":
            with STATE.lock:
                for task in STATE.tasks.values():
                    task.cancelled_streams.add(str(params.get("requestId")))
                STATE.lock.notify_all()
            return self._json(None, 202)
        if method.startswith("notifications/"):
            return self._json(None, 202)
        if method == "tasks/result":
            return self._result(rid, params["taskId"])
        result = self._dispatch(method, params)
        if method == "tools/call" and result.pop("lose", False):
            self.close_connection = True  # created, and the reply never leaves
            return None
        push = result.pop("push", None)
        if push is not None:
            return self._stream_reply(rid, result, push)
        if "error" in result:
            return self._json({"jsonrpc": "2.0", "id": rid, "error": result["error"]})
        return self._json({"jsonrpc": "2.0", "id": rid, "result": result})

    def _dispatch(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "initialize":
            capabilities: dict[str, Any] = {
                "tools": {}, "tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}}
            if not self.path.endswith("-nokey"):
                capabilities["experimental"] = KEY_CAPABILITY
            return {"protocolVersion": PROTOCOL, "serverInfo": {"name": "status", "version": "1"},
                    "capabilities": capabilities}
        if method == "tools/list":
            return {"tools": [{"name": "scripted", "inputSchema": {"type": "object"},
                               "execution": {"taskSupport": "required"}}]}
        if method == "tools/call":
            script = dict((params.get("arguments") or {}).get("script") or {})
            with STATE.lock:
                task = Task(task_id=f"st-{next(STATE.ids)}", script=script,
                            status=script.get("create", "working"),
                            gets=list(script.get("get") or ["working"]),
                            submission_key=str((params.get("_meta") or {}).get(SUBMISSION_KEY_META)))
                STATE.tasks[task.task_id] = task
                STATE.ask(task)
                return {"task": task.wire(), "lose": bool(script.get("lose_create"))}
        with STATE.lock:
            if method == "tasks/list":
                return {"tasks": [t.wire() for t in STATE.tasks.values()]}
            task = STATE.tasks.get(str(params.get("taskId")))
            if task is None:
                return {"error": {"code": -32602, "message": "Task not found"}}
            if method == "tasks/get":
                if not task.pending:
                    STATE.advance(task)
                notify = task.script.get("notify")
                if notify:
                    return {**task.wire(), "push": {"jsonrpc": "2.0", "method":
                                                    "notifications/tasks/status", "params": notify}}
                return task.wire()
            if method == "tasks/cancel":
                answer = task.script.get("cancel", "cancelled")
                if answer == "error" or task.status in TERMINAL:
                    return {"error": {"code": -32602, "message": "Task already terminal"}}
                if answer == "cancelled":
                    task.status, task.gets = "cancelled", ["cancelled"]
                    task.pending.clear()
                return {**task.wire(), "status": answer}
        return {"error": {"code": -32601, "message": f"no method {method}"}}

    def _lookup(self, key: str) -> None:
        task = STATE.by_key(key)
        if task is None:
            return self._json({"fenced": True}, 404)
        return self._json({"taskId": task.task_id, "sameSession": True})

    def _stream_reply(self, rid: Any, result: dict[str, Any], push: dict[str, Any]) -> None:
        """The reply on an SSE stream, after a message the server pushes first."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Mcp-Session-Id", "status-session")
        self.end_headers()
        for message in (push, {"jsonrpc": "2.0", "id": rid, "result": result}):
            self.wfile.write(f"event: message\ndata: {json.dumps(message)}\n\n".encode())
        self.wfile.flush()

    def _answer(self, body: dict[str, Any]) -> None:
        with STATE.lock:
            for task in STATE.tasks.values():
                if task.pending.pop(str(body.get("id")), None) is not None:
                    task.answers.append((body.get("result") or {}).get("content"))
                    STATE.advance(task)

    def _result(self, rid: Any, task_id: str) -> None:
        with STATE.lock:
            task = STATE.tasks.get(task_id)
            if task is None:
                return self._json({"jsonrpc": "2.0", "id": rid,
                                   "error": {"code": -32602, "message": "Task not found"}})
            if task.status in TERMINAL and task.script.get("result_errors", 0) > 0:
                task.script["result_errors"] -= 1
                return self._json({"jsonrpc": "2.0", "id": rid,
                                   "error": {"code": -32603, "message": "try again"}})
            if task.status in TERMINAL:
                result = dict(task.script.get("result") or {"content": [
                    {"type": "text", "text": json.dumps(task.answers)}]})
                result["_meta"] = {RELATED: {"taskId": task_id}}
                return self._json({"jsonrpc": "2.0", "id": rid, "result": result})
            pending = list(task.pending.values())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Mcp-Session-Id", "status-session")
        self.end_headers()
        for request in pending:
            self.wfile.write(f"event: message\ndata: {json.dumps(request)}\n\n".encode())
        self.wfile.flush()
        with STATE.lock:  # held until the client cancels it, or the task ends (bounded)
            STATE.lock.wait_for(lambda: str(rid) in task.cancelled_streams
                                or task.status in TERMINAL, timeout=10.0)
        error = {"jsonrpc": "2.0", "id": rid, "error": {"code": 0, "message": "Request cancelled"}}
        self.wfile.write(f"event: message\ndata: {json.dumps(error)}\n\n".encode())
        self.wfile.flush()


def serve(port: int) -> ThreadingHTTPServer:
    return serve_handler(Handler, port=port)


def main() -> None:
    serve_main(Handler)


if __name__ == "__main__":
    main()

