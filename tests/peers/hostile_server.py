"""A scriptable hostile MCP server (2025-11-25 tasks over Streamable HTTP), over real HTTP.

Plain ASGI on uvicorn, no SDK: an SDK would refuse to send most of what this server exists to
send. It speaks enough of the protocol for a client to register it and run tasks (initialize,
notifications/initialized, tools/list, tools/call with `task`, tasks/get, tasks/result,
tasks/cancel, tasks/list), and misbehaves per TOOL NAME: every tool in MISBEHAVIOURS is one
fault, placed in the create reply ("create"), in `tasks/get` ("get"), in `tasks/result`
("result") or in the input channel ("input"). The tool `ok` (and any tool not listed) behaves.
A task completes about COMPLETE_AFTER_S after its creation; its result is `{"text": "ok-<id>"}`.

Run: python -m tests.peers.hostile_server --port PORT [--host 127.0.0.1] [--trickle-s 1.0]
MCP endpoint: /mcp. Test-only: GET /_hostile/stats (counts per method and tool).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import uvicorn

PROTOCOL_VERSION = "2025-11-25"
RELATED = "io.modelcontextprotocol/related-task"
COMPLETE_AFTER_S = 0.3
DEEP = 5000
BIG_BODY_BYTES = 2 * 1024 * 1024
TRICKLE_S = 1.0  # seconds between two bytes of a trickled reply (--trickle-s)

# tool name -> (phase, what the client must make of it). The second element is documentation
# for the test; the server only looks at the name.
MISBEHAVIOURS: dict[str, tuple[str, str]] = {
    # the tools/call reply
    "create_long_task_id": ("create", "1,000-character taskId"),
    "create_poll_negative": ("create", "pollInterval -1000"),
    "create_naive_created": ("create", "createdAt without a zone"),
    "create_status_outside": ("create", "status 'paused'"),
    "create_wrong_content_type": ("create", "JSON body sent as text/plain"),
    "create_invalid_json": ("create", "body is not JSON"),
    "create_wrong_rpc_id": ("create", "response carries another JSON-RPC id"),
    "create_html_500": ("create", "HTTP 500 with an HTML page"),
    "create_redirect": ("create", "HTTP 307 to another URL"),
    "create_trickle": ("create", "reply sent one byte per trickle interval"),
    # tasks/get
    "get_poll_negative": ("get", "pollInterval -5"),
    "get_poll_huge": ("get", "pollInterval 2**40 on the completed status"),
    "get_status_message_nul": ("get", "NUL in statusMessage"),
    "get_created_invalid": ("get", "createdAt month 13"),
    "get_created_naive": ("get", "createdAt without a zone"),
    "get_ttl_huge": ("get", "ttl 10**20 on every status (the first get says working)"),
    "get_ttl_negative": ("get", "ttl -5"),
    "get_status_outside": ("get", "status 'paused'"),
    "get_status_message_huge": ("get", "20,000-character statusMessage on the completed status"),
    "get_other_task": ("get", "answers about another taskId"),
    "get_deep": ("get", "_meta nested 5,000 deep"),
    "get_html_500": ("get", "HTTP 500 with an HTML page"),
    "get_redirect": ("get", "HTTP 302 to another URL"),
    "get_truncated_sse": ("get", "SSE stream ends before the response"),
    "get_wrong_content_type": ("get", "text/html 200"),
    "get_invalid_json": ("get", "truncated JSON"),
    "get_wrong_rpc_id": ("get", "response carries another JSON-RPC id"),
    "get_oversize": ("get", "2 MiB reply"),
    "get_trickle": ("get", "reply sent one byte per trickle interval"),
    # tasks/result
    "result_nul": ("result", "NUL in the result text"),
    "result_surrogate": ("result", "lone surrogate in the result text"),
    "result_deep": ("result", "structuredContent nested 5,000 deep"),
    "result_big_int": ("result", "10**30 in structuredContent"),
    "result_float_overflow": ("result", "1e400 in structuredContent"),
    "result_other_task": ("result", "result tagged with another task"),
    "result_oversize": ("result", "2 MiB result"),
    # input
    "input_endless": ("input", "input_required, then 100 elicitation requests on one stream"),
}

STATS: Counter[str] = Counter()
TASKS: dict[str, dict[str, Any]] = {}


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


class Reply:
    """What to send back: a JSON-RPC message (JSON or SSE), or raw bytes with a status."""

    def __init__(self, *, status: int = 200, body: bytes = b"", content_type: str = "application/json",
                 headers: dict[str, str] | None = None, trickle: bool = False,
                 sse_events: list[bytes] | None = None) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers or {}
        self.trickle = trickle
        self.sse_events = sse_events


def _rpc(rpc_id: Any, result: dict[str, Any] | None = None, *, error: dict[str, Any] | None = None,
         raw_text: str | None = None) -> Reply:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": rpc_id}
    if error is not None:
        message["error"] = error
    else:
        message["result"] = result
    text = raw_text if raw_text is not None else json.dumps(message)
    return Reply(body=text.encode())


def _raw_json(message: dict[str, Any], replacements: dict[str, str]) -> str:
    """json.dumps, then swap placeholders for text json.dumps would never write (1e400,
    10**30 as a literal, a lone surrogate escape)."""
    text = json.dumps(message)
    for placeholder, literal in replacements.items():
        text = text.replace(json.dumps(placeholder), literal)
    return text


def _task_body(task: dict[str, Any], *, status: str) -> dict[str, Any]:
    return {"taskId": task["id"], "status": status, "createdAt": task["createdAt"],
            "lastUpdatedAt": _now_iso(), "ttl": task["ttl"], "pollInterval": 100,
            "statusMessage": f"{status} ({task['tool']})"}


def _status_of(task: dict[str, Any]) -> str:
    if task["tool"] == "input_endless":
        return "input_required"
    elapsed = asyncio.get_running_loop().time() - task["t0"]
    return "completed" if elapsed >= COMPLETE_AFTER_S else "working"


def _transport_fault(tool: str, phase: str, rpc_id: Any, message: dict[str, Any]) -> Reply | None:
    """Faults that are about HTTP, not about a field: shared by create and get."""
    kind = tool.removeprefix(f"{phase}_")
    if kind == "wrong_content_type":
        if phase == "create":
            return Reply(body=json.dumps(message).encode(), content_type="text/plain")
        return Reply(body=b"<html><body>hello</body></html>", content_type="text/html")
    if kind == "invalid_json":
        return Reply(body=json.dumps(message).encode()[:-7])
    if kind == "wrong_rpc_id":
        return Reply(body=json.dumps({**message, "id": "not-yours"}).encode())
    if kind == "html_500":
        return Reply(status=500, body=b"<html><h1>Internal Server Error</h1></html>",
                     content_type="text/html")
    if kind == "redirect":
        return Reply(status=307 if phase == "create" else 302, headers={"location": "/elsewhere"},
                     body=b"", content_type="text/plain")
    if kind == "trickle":
        return Reply(body=json.dumps(message).encode(), trickle=True)
    if kind == "truncated_sse":
        partial = b"event: message\ndata: " + json.dumps(message).encode()[:20]
        return Reply(content_type="text/event-stream", sse_events=[b": hello\n\n", partial])
    if kind == "oversize":
        padded = {**message, "result": {**message["result"], "_meta": {"pad": "x" * BIG_BODY_BYTES}}}
        return Reply(body=json.dumps(padded).encode())
    return None


def _create(rpc_id: Any, params: dict[str, Any]) -> Reply:
    tool = str(params.get("name"))
    task_id = f"t-{uuid.uuid4().hex[:16]}"
    ttl = (params.get("task") or {}).get("ttl") or 60_000
    task = {"id": task_id, "tool": tool, "createdAt": _now_iso(), "ttl": ttl,
            "t0": asyncio.get_running_loop().time()}
    TASKS[task_id] = task
    body = _task_body(task, status="working")
    if tool == "create_long_task_id":
        body["taskId"] = "x" * 1000
    elif tool == "create_poll_negative":
        body["pollInterval"] = -1000
    elif tool == "create_naive_created":
        body["createdAt"] = "2026-01-01T00:00:00"
    elif tool == "create_status_outside":
        body["status"] = "paused"
    message = {"jsonrpc": "2.0", "id": rpc_id, "result": {"task": body}}
    fault = _transport_fault(tool, "create", rpc_id, message) if tool.startswith("create_") else None
    return fault or Reply(body=json.dumps(message).encode())


def _get(rpc_id: Any, params: dict[str, Any]) -> Reply:
    task = TASKS.get(str(params.get("taskId")))
    if task is None:
        return _rpc(rpc_id, error={"code": -32602, "message": "unknown task"})
    task["gets"] = task.get("gets", 0) + 1
    tool, status = task["tool"], _status_of(task)
    if tool == "get_ttl_huge" and task["gets"] == 1:
        status = "working"  # the ledger stores a ttl from a working observation
    body = _task_body(task, status=status)
    replacements: dict[str, str] = {}
    if tool == "get_poll_negative":
        body["pollInterval"] = -5
    elif tool == "get_poll_huge" and status == "completed":
        body["pollInterval"] = 2**40
    elif tool == "get_status_message_nul":
        body["statusMessage"] = "bad\u0000message"
    elif tool == "get_created_invalid":
        body["createdAt"] = "2026-13-45T00:00:00Z"
    elif tool == "get_created_naive":
        body["createdAt"] = "2026-01-01T00:00:00"
    elif tool == "get_ttl_huge":
        body["ttl"] = "TTL_HUGE"
        replacements["TTL_HUGE"] = str(10**20)
    elif tool == "get_ttl_negative":
        body["ttl"] = -5
    elif tool == "get_status_outside":
        body["status"] = "paused"
    elif tool == "get_status_message_huge" and status == "completed":
        body["statusMessage"] = "m" * 20_000
    elif tool == "get_other_task":
        body["taskId"] = "t-someone-else"
    elif tool == "get_deep":
        body["_meta"] = {"deep": _deep(DEEP)}
    message = {"jsonrpc": "2.0", "id": rpc_id, "result": body}
    if tool.startswith("get_"):
        fault = _transport_fault(tool, "get", rpc_id, message)
        if fault is not None:
            return fault
    if tool == "get_deep":
        # json.dumps would recurse 5,000 deep too: write the nesting by hand.
        body["_meta"] = {"deep": "DEEP"}
        replacements["DEEP"] = "[" * DEEP + "1" + "]" * DEEP
    return Reply(body=_raw_json(message, replacements).encode())


def _result(rpc_id: Any, params: dict[str, Any]) -> Reply:
    task = TASKS.get(str(params.get("taskId")))
    if task is None:
        return _rpc(rpc_id, error={"code": -32602, "message": "unknown task"})
    tool = task["tool"]
    if tool == "input_endless":
        return _endless_input(rpc_id, task)
    text = f"ok-{task['id']}"
    structured: dict[str, Any] = {"text": text}
    replacements: dict[str, str] = {}
    related = task["id"]
    if tool == "result_nul":
        text = "bad\u0000text"
    elif tool == "result_surrogate":
        text = "SURROGATE"
        replacements["SURROGATE"] = '"bad \\ud800 text"'
    elif tool == "result_deep":
        structured = {"deep": "DEEP"}
        replacements["DEEP"] = "[" * DEEP + "1" + "]" * DEEP
    elif tool == "result_big_int":
        structured = {"n": "BIG"}
        replacements["BIG"] = str(10**30)
    elif tool == "result_float_overflow":
        structured = {"x": "HUGEFLOAT"}
        replacements["HUGEFLOAT"] = "1e400"
    elif tool == "result_other_task":
        related = "t-someone-else"
    elif tool == "result_oversize":
        text = "x" * BIG_BODY_BYTES
    result = {"content": [{"type": "text", "text": text}], "structuredContent": structured,
              "isError": False, "_meta": {RELATED: {"taskId": related}}}
    return Reply(body=_raw_json({"jsonrpc": "2.0", "id": rpc_id, "result": result}, replacements).encode())


def _endless_input(rpc_id: Any, task: dict[str, Any]) -> Reply:
    """Elicitation requests without end (100 here), then the stream ends without a response."""
    events = []
    for n in range(100):
        request = {"jsonrpc": "2.0", "id": f"in-{task['id']}-{n}", "method": "elicitation/create",
                   "params": {"message": f"question {n}", "mode": "form",
                              "requestedSchema": {"type": "object", "properties": {}},
                              "_meta": {RELATED: {"taskId": task["id"]}}}}
        events.append(b"event: message\ndata: " + json.dumps(request).encode() + b"\n\n")
    return Reply(content_type="text/event-stream", sse_events=events)


def _dispatch(message: dict[str, Any]) -> tuple[Reply, dict[str, str]]:
    method, rpc_id = message.get("method"), message.get("id")
    params = message.get("params") or {}
    STATS[f"method:{method}"] += 1
    if method == "initialize":
        result = {"protocolVersion": PROTOCOL_VERSION,
                  "capabilities": {"tools": {}, "tasks": {"requests": {"tools": {"call": {}}},
                                                          "cancel": {}, "list": {}}},
                  "serverInfo": {"name": "hostile", "version": "1"}}
        return _rpc(rpc_id, result), {"mcp-session-id": uuid.uuid4().hex}
    if rpc_id is None:  # a notification (notifications/initialized)
        return Reply(status=202, body=b""), {}
    if method == "tools/list":
        names = ["ok", *MISBEHAVIOURS]
        tools = [{"name": n, "inputSchema": {"type": "object"}, "execution": {"taskSupport": "optional"}}
                 for n in names]
        return _rpc(rpc_id, {"tools": tools}), {}
    if method == "tools/call":
        STATS[f"tool:{params.get('name')}"] += 1
        return _create(rpc_id, params), {}
    if method == "tasks/get":
        return _get(rpc_id, params), {}
    if method == "tasks/result":
        return _result(rpc_id, params), {}
    if method == "tasks/cancel":
        task = TASKS.get(str(params.get("taskId")))
        if task is None:
            return _rpc(rpc_id, error={"code": -32602, "message": "unknown task"}), {}
        return _rpc(rpc_id, _task_body(task, status="cancelled")), {}
    if method == "tasks/list":
        return _rpc(rpc_id, {"tasks": []}), {}
    return _rpc(rpc_id, error={"code": -32601, "message": "method not found"}), {}


async def _send(send: Any, reply: Reply, extra_headers: dict[str, str]) -> None:
    headers = {"content-type": reply.content_type, **reply.headers, **extra_headers}
    if reply.sse_events is None and not reply.trickle:
        headers["content-length"] = str(len(reply.body))
    await send({"type": "http.response.start", "status": reply.status,
                "headers": [(k.encode(), v.encode()) for k, v in headers.items()]})
    if reply.sse_events is not None:
        for event in reply.sse_events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    if reply.trickle:
        for byte in reply.body:
            await send({"type": "http.response.body", "body": bytes([byte]), "more_body": True})
            await asyncio.sleep(TRICKLE_S)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    await send({"type": "http.response.body", "body": reply.body, "more_body": False})


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        event = await receive()
        chunks.append(event.get("body", b""))
        if not event.get("more_body"):
            return b"".join(chunks)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            event = await receive()
            if event["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif event["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    path, method = scope["path"], scope["method"]
    if path == "/_hostile/stats":
        body = json.dumps({"stats": dict(STATS), "misbehaviours": list(MISBEHAVIOURS)}).encode()
        await _send(send, Reply(body=body), {})
        return
    if path != "/mcp" or method != "POST":
        await _send(send, Reply(status=404, body=b"not here", content_type="text/plain"), {})
        return
    raw = await _read_body(receive)
    try:
        message = json.loads(raw)
    except ValueError:
        await _send(send, _rpc(None, error={"code": -32700, "message": "parse error"}), {})
        return
    if "method" not in message:  # a response to one of our requests (input answers)
        STATS["client_responses"] += 1
        await _send(send, Reply(status=202, body=b""), {})
        return
    reply, headers = _dispatch(message)
    await _send(send, reply, headers)


def main() -> None:
    global TRICKLE_S
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--trickle-s", type=float, default=TRICKLE_S)
    args = parser.parse_args()
    TRICKLE_S = args.trickle_s
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
