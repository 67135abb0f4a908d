"""A scriptable tasks-extension (2026-07-28, Shape B) server: each call states what it will report.

For the conformance cells the official extension server (FastMCP + fastmcp-tasks) cannot be told
to produce: a create reply that is already terminal or carries a status the protocol lacks, a
`tasks/get` that is `cancelled` without our cancel, a cancel acknowledged while the task goes on,
an inline outcome missing or next to pending input requests, an answered input request that keeps
coming back. JSON over HTTP, SSE only to push a notification before a reply. Standard library only.

The one tool, `scripted`, takes `{"script": {...}}`:
  create:  status in the create reply (default "working")
  get:     list of statuses `tasks/get` reports in turn (the last one repeats)
  cancel:  "cancelled" (the task ends cancelled at once) or "ack" (acknowledged, it goes on)
  result:  the CallToolResult a completed task carries inline; error: a failed task's error
  outcome: "omit" (a completed / failed task without its result / error), "both" /
           "both_error" (an `input_required` task that also carries a result / an error) or
           "inputs" (a task of any status that also carries `inputRequests`)
  sticky_input: true: an answered input request keeps being reported, the task stays waiting
  notify:  params of a `notifications/tasks/status` pushed (SSE) before every `tasks/get` reply
A task in `input_required` carries one `inputRequests` entry per round; `tasks/update` answering
it moves the script on (unless sticky).

Run: python -m tests.peers.status_server_ext --port PORT (MCP endpoint /mcp).
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

PROTOCOL = "2026-07-28"
EXTENSION = "io.modelcontextprotocol/tasks"


@dataclass
class Task:
    task_id: str
    script: dict[str, Any]
    status: str
    gets: list[str]
    answers: dict[str, Any] = field(default_factory=dict)
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    rounds: int = 1

    @property
    def key(self) -> str:
        """The current round's input request key."""
        return f"k-{self.task_id}-{self.rounds}"

    def wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"taskId": self.task_id, "status": self.status,
                                "createdAt": self.created, "pollIntervalMs": 100, "ttlMs": 60_000}
        omit = self.script.get("outcome") == "omit"
        if self.status == "completed" and not omit:
            body["result"] = self.script.get("result") or {
                "content": [{"type": "text", "text": json.dumps(self.answers)}]}
        if self.status == "failed" and not omit:
            body["error"] = self.script.get("error") or {"code": -32000, "message": "tool failed"}
        if self.status == "input_required" or self.script.get("outcome") == "inputs":
            body["inputRequests"] = {self.key: {"method": "elicitation/create", "params": {
                "mode": "form", "message": "value?", "requestedSchema": SCHEMA}}}
        if self.status == "input_required" and self.script.get("outcome") == "both":
            body["result"] = {"content": [{"type": "text", "text": "both"}]}
        if self.status == "input_required" and self.script.get("outcome") == "both_error":
            body["error"] = {"code": -32000, "message": "both"}
        return body

    def advance(self) -> None:
        if self.status in TERMINAL or self.status == "input_required":
            return  # terminal, or waiting for its answer
        self.status = self.gets.pop(0) if len(self.gets) > 1 else self.gets[0]

    def answer(self, key: str, answer: Any) -> None:
        self.answers.setdefault(key, answer)
        if key == self.key and self.status == "input_required" and not self.script.get("sticky_input"):
            self.rounds += 1
            self.status = "working"
            self.advance()


class State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tasks: dict[str, Task] = {}
        self.ids = itertools.count(1)


STATE = State()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, messages: list[dict[str, Any]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for message in messages:
            self.wfile.write(f"event: message\ndata: {json.dumps(message)}\n\n".encode())
        self.wfile.flush()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        rid, params = body.get("id"), body.get("params") or {}
        with STATE.lock:
            result, push = self._dispatch(str(body.get("method")), params)
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": rid}
        # A JSON-RPC error is marked as such: a failed task's own `error` field is a result.
        reply.update({"error": result["rpc_error"]} if "rpc_error" in result else {"result": result})
        if push is not None:
            return self._stream([{"jsonrpc": "2.0", "method": "notifications/tasks/status",
                                  "params": push}, reply])
        return self._send(reply)

    def _dispatch(self, method: str, params: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        if method == "server/discover":
            return {"supportedVersions": [PROTOCOL],
                    "capabilities": {"tools": {}, "extensions": {EXTENSION: {}}},
                    "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "status-ext",
                                                                     "version": "1"}}}, None
        if method == "tools/list":
            return {"tools": [{"name": "scripted", "inputSchema": {"type": "object"}}]}, None
        if method == "tools/call":
            script = dict((params.get("arguments") or {}).get("script") or {})
            task = Task(task_id=f"sx-{next(STATE.ids)}", script=script,
                        status=script.get("create", "working"),
                        gets=list(script.get("get") or ["working"]))
            STATE.tasks[task.task_id] = task
            return {"resultType": "task", **task.wire()}, None
        task = STATE.tasks.get(str(params.get("taskId")))
        if task is None:
            return {"rpc_error": {"code": -32602, "message": "Task not found"}}, None
        if method == "tasks/get":
            task.advance()
            return task.wire(), task.script.get("notify")
        if method == "tasks/update":
            for key, answer in (params.get("inputResponses") or {}).items():
                task.answer(str(key), answer)
            return {}, None
        if method == "tasks/cancel":
            if task.script.get("cancel", "cancelled") == "cancelled" and task.status not in TERMINAL:
                task.status, task.gets = "cancelled", ["cancelled"]
            return {}, None
        return {"rpc_error": {"code": -32601, "message": f"no method {method}"}}, None


def serve(port: int) -> ThreadingHTTPServer:
    return serve_handler(Handler, port=port)


def main() -> None:
    serve_main(Handler)


if __name__ == "__main__":
    main()
