"""In-repo fake of a Google AIP-151 long-running-operations API over HTTP/JSON.

No public AIP-151 server fits (lro-shapes.md section 4), so this one follows the protos and
AIPs directly, on the standard library's HTTP server (full control over the socket: the
"record, then drop the connection" mode needs it).

Endpoints (prefix `v1`, parent `projects/p/locations/l`, names nested and opaque):
* POST /v1/projects/p/locations/l/jobs:run   create; body = arguments + `requestId` (AIP-155)
    arguments: seconds (run time), outcome "response" | "error" (errorCode, message) | "neither"
    | "both" (a done operation breaking "exactly one of", for conformance tests) | "done_string"
    (a done operation whose `done` is the string "true", not a boolean),
    value, instant (done on create), cancelLoses (cancel is acked, work finishes anyway),
    cancelDelaySeconds (cancellation takes effect later), expireAfterSeconds (gone after done)
* GET    /v1/{name}            GetOperation (ticking `metadata` with `@type`)
* POST   /v1/{name}:cancel     CancelOperation (best effort; done -> harmless no-op)
* DELETE /v1/{name}            DeleteOperation (does not cancel)
* GET    /v1/projects/p/locations/l/operations   ListOperations
Same `requestId` -> the same operation; same id with another body -> 409 ALREADY_EXISTS
(the documented choice of section 1.5). Errors use the AIP-193 envelope with one ErrorInfo.
Test controls: POST /_fake/faults, GET /_fake/stats, POST /_fake/reset.
"""

from __future__ import annotations

import argparse
import email.utils
import json
import secrets
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PARENT = "projects/p/locations/l"
METADATA_TYPE = "type.googleapis.com/toolops.fake.v1.JobMetadata"
RESPONSE_TYPE = "type.googleapis.com/toolops.fake.v1.JobResult"
STATUS_NAMES = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 409: "ALREADY_EXISTS", 429: "RESOURCE_EXHAUSTED",
                501: "UNIMPLEMENTED", 503: "UNAVAILABLE", 500: "INTERNAL"}


@dataclass
class Op:
    name: str
    request_id: str
    fingerprint: str
    created: float
    seconds: float
    outcome: str
    value: str
    error_code: int
    error_message: str
    cancel_loses: bool
    cancel_delay: float
    expire_after: float | None
    cancel_at: float | None = None
    finished_at: float | None = None


@dataclass
class Fault:
    status: int
    count: int
    retry_after: str | None  # "N" seconds or "date:N" (an HTTP-date N seconds ahead)
    match: str  # "create" | "get" | "cancel" | "any"


@dataclass
class State:
    ops: dict[str, Op] = field(default_factory=dict)
    by_request_id: dict[str, str] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    drop_after_commit: int = 0
    unimplemented: set[str] = field(default_factory=set)
    counters: Counter[str] = field(default_factory=Counter)
    create_requests: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


STATE = State()


def _now() -> float:
    return time.monotonic()


def _settle(op: Op, now: float) -> None:
    """Lazily move an operation on: finish it, or apply a pending cancel."""
    if op.finished_at is not None:
        return
    if op.cancel_at is not None and now >= op.cancel_at and not op.cancel_loses:
        op.outcome, op.error_code, op.error_message = "cancelled", 1, "Operation was cancelled"
        op.finished_at = op.cancel_at
        return
    if now >= op.created + op.seconds:
        op.finished_at = op.created + op.seconds


def _json(op: Op, now: float) -> dict[str, Any]:
    _settle(op, now)
    progress = 100 if op.finished_at is not None else int(100 * (now - op.created) / max(op.seconds, 1e-6))
    body: dict[str, Any] = {
        "name": op.name,
        "metadata": {"@type": METADATA_TYPE, "progressPercent": min(progress, 100)},
        "done": op.finished_at is not None,
    }
    if op.finished_at is not None and op.outcome == "done_string":
        body["done"] = "true"  # breaks AIP-151's boolean `done` (conformance tests)
    if op.finished_at is not None:
        # "neither" / "both": a server breaking AIP-151's "exactly one of" (conformance tests).
        if op.outcome in ("response", "both", "done_string"):
            body["response"] = {"@type": RESPONSE_TYPE, "value": op.value}
        if op.outcome in ("error", "both", "cancelled"):
            body["error"] = {"code": op.error_code, "message": op.error_message, "details": []}
    return body


def _expired(op: Op, now: float) -> bool:
    _settle(op, now)
    if op.expire_after is None or op.finished_at is None:
        return False
    return now >= op.finished_at + op.expire_after


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        return

    # -- plumbing --------------------------------------------------------------------------

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(raw)

    def _error(self, status: int, message: str, reason: str, headers: dict[str, str] | None = None) -> None:
        self._send(status, {"error": {
            "code": status, "message": message, "status": STATUS_NAMES.get(status, "UNKNOWN"),
            "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                         "domain": "fake.toolops.test", "metadata": {}}],
        }}, headers)

    def _body(self) -> dict[str, Any]:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            parsed = json.loads(raw or b"{}")
        except ValueError:
            return {"__invalid__": True}
        return parsed if isinstance(parsed, dict) else {"__invalid__": True}

    def _fault(self, kind: str) -> bool:
        with STATE.lock:
            for fault in STATE.faults:
                if fault.count > 0 and fault.match in (kind, "any"):
                    fault.count -= 1
                    STATE.counters[f"fault_{fault.status}"] += 1
                    break
            else:
                return False
        headers: dict[str, str] = {}
        if fault.retry_after is not None:
            if fault.retry_after.startswith("date:"):
                when = time.time() + float(fault.retry_after[5:])
                headers["Retry-After"] = email.utils.formatdate(when, usegmt=True)
            else:
                headers["Retry-After"] = fault.retry_after
        self._error(fault.status, "injected fault", "INJECTED", headers)
        return True

    def _op_name(self, path: str) -> str | None:
        prefix = f"/v1/{PARENT}/operations/"
        return path[len("/v1/"):] if path.startswith(prefix) and len(path) > len(prefix) else None

    # -- verbs -----------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        STATE.counters["requests"] += 1
        if path == "/_fake/stats":
            with STATE.lock:
                self._send(200, {"operations": len(STATE.ops), "counters": dict(STATE.counters),
                                 "create_requests": dict(STATE.create_requests),
                                 "names_by_request_id": dict(STATE.by_request_id)})
            return
        if path == f"/v1/{PARENT}/operations":
            if "list" in STATE.unimplemented:
                self._error(501, "ListOperations is not implemented", "UNIMPLEMENTED")
                return
            now = _now()
            with STATE.lock:
                ops = [_json(op, now) for op in STATE.ops.values() if not _expired(op, now)]
            self._send(200, {"operations": ops, "nextPageToken": ""})
            return
        name = self._op_name(path)
        if name is None:
            self._error(404, f"no such method: GET {path}", "METHOD_NOT_FOUND")
            return
        if self._fault("get"):
            return
        now = _now()
        with STATE.lock:
            STATE.counters["get"] += 1
            op = STATE.ops.get(name)
            if op is None or _expired(op, now):
                STATE.ops.pop(name, None)
                self._error(404, f"operation {name} not found", "OPERATION_NOT_FOUND")
                return
            body = _json(op, now)
        self._send(200, body)

    def do_DELETE(self) -> None:
        STATE.counters["requests"] += 1
        name = self._op_name(self.path.split("?")[0])
        if name is None:
            self._error(404, "no such method", "METHOD_NOT_FOUND")
            return
        if "delete" in STATE.unimplemented:
            self._error(501, "DeleteOperation is not implemented", "UNIMPLEMENTED")
            return
        with STATE.lock:
            STATE.counters["delete"] += 1
            if STATE.ops.pop(name, None) is None:
                self._error(404, f"operation {name} not found", "OPERATION_NOT_FOUND")
                return
        self._send(200, {})

    def do_POST(self) -> None:
        path = self.path.split("?")[0]
        STATE.counters["requests"] += 1
        body = self._body()
        if path == "/_fake/faults":
            with STATE.lock:
                for fault in body.get("faults", []):
                    STATE.faults.append(Fault(status=int(fault["status"]), count=int(fault.get("count", 1)),
                                              retry_after=fault.get("retryAfter"),
                                              match=fault.get("match", "any")))
                STATE.drop_after_commit += int(body.get("dropAfterCommit", 0))
                STATE.unimplemented = set(body.get("unimplemented", STATE.unimplemented))
            self._send(200, {})
            return
        if path == "/_fake/reset":
            with STATE.lock:
                STATE.faults.clear()
                STATE.drop_after_commit = 0
                STATE.unimplemented = set()
            self._send(200, {})
            return
        if path == f"/v1/{PARENT}/jobs:run":
            self._create(body)
            return
        if path.endswith(":cancel") and (name := self._op_name(path[: -len(":cancel")])):
            self._cancel(name)
            return
        self._error(404, f"no such method: POST {path}", "METHOD_NOT_FOUND")

    def _create(self, body: dict[str, Any]) -> None:
        if self._fault("create"):
            return
        request_id = body.get("requestId")
        if body.get("__invalid__") or not isinstance(request_id, str) or not 0 < len(request_id) <= 36:
            self._error(400, "requestId is required (at most 36 characters)", "INVALID_REQUEST_ID")
            return
        args = {k: v for k, v in body.items() if k != "requestId"}
        fingerprint = json.dumps(args, sort_keys=True)
        now = _now()
        with STATE.lock:
            STATE.create_requests[request_id] += 1
            existing = STATE.by_request_id.get(request_id)
            if existing is not None:
                op = STATE.ops.get(existing)
                if op is not None and op.fingerprint != fingerprint:
                    self._error(409, "requestId reused with another request body", "REQUEST_ID_REUSED")
                    return
                # AIP-155: the earlier response, i.e. the same operation (its current state).
                payload = _json(op, now) if op is not None else None
            else:
                name = f"{PARENT}/operations/{secrets.token_hex(8)}"
                instant = bool(args.get("instant"))
                op = Op(
                    name=name, request_id=request_id, fingerprint=fingerprint, created=now,
                    seconds=0.0 if instant else float(args.get("seconds", 0.3)),
                    outcome=str(args["outcome"]) if args.get("outcome") in (
                        "error", "neither", "both", "done_string")
                    else "response",
                    value=str(args.get("value", "done")), error_code=int(args.get("errorCode", 13)),
                    error_message=str(args.get("message", "deliberate failure")),
                    cancel_loses=bool(args.get("cancelLoses")),
                    cancel_delay=float(args.get("cancelDelaySeconds", 0.0)),
                    expire_after=float(args["expireAfterSeconds"]) if "expireAfterSeconds" in args else None,
                )
                STATE.ops[name] = op
                STATE.by_request_id[request_id] = name
                STATE.counters["created"] += 1
                payload = _json(op, now)
            drop = STATE.drop_after_commit > 0
            if drop:
                STATE.drop_after_commit -= 1
                STATE.counters["dropped_after_commit"] += 1
        if payload is None:
            self._error(404, "the operation for this requestId was deleted", "OPERATION_NOT_FOUND")
            return
        if drop:
            # Recorded; the client never hears of it.
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._send(200, payload)

    def _cancel(self, name: str) -> None:
        if "cancel" in STATE.unimplemented:
            self._error(501, "CancelOperation is not implemented", "UNIMPLEMENTED")
            return
        if self._fault("cancel"):
            return
        now = _now()
        with STATE.lock:
            STATE.counters["cancel"] += 1
            op = STATE.ops.get(name)
            if op is None or _expired(op, now):
                self._error(404, f"operation {name} not found", "OPERATION_NOT_FOUND")
                return
            _settle(op, now)
            if op.finished_at is None and op.cancel_at is None:
                op.cancel_at = now + op.cancel_delay
        self._send(200, {})  # Empty: cancellation is asynchronous and best effort


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
