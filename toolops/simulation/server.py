"""The simulated MCP 2025-11-25 server: ground truth, fault plans, and an in-process httpx transport.

No Django here: the server knows nothing of the ledger. It speaks the Streamable HTTP JSON shape
adapters/mcp_tasks_2025.py reads (initialize with a session header, tools/list, task-augmented
tools/call, tasks/get, tasks/result, tasks/cancel, input requests on a tasks/result SSE stream,
their answers as posted JSON-RPC responses) plus the cooperating fencing key lookup of
adapters/mcp_tasks_2025_keys.py at /_sim/keys. Its task table is the ground truth the simulation
compares receipts with; it counts operations per submission key and requests per virtual second.

Faults are per task, from the series' plan (toolops/simulation/plan.py); each fires a bounded
number of times so every series can still end.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from ledger.states import TerminalStatus
from toolops.simulation.plan import SeriesPlan

PROTOCOL = "2025-11-25"
KEY_META = "io.toolops/submission-key"
RELATED = "io.modelcontextprotocol/related-task"
TOOL = "sim_work"
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
INVALID_PARAMS = -32602
TERMINAL = frozenset(TerminalStatus.values)


@dataclass
class SimTask:
    task_id: str
    key: str
    plan: SeriesPlan
    created: float
    ttl_ms: int
    status: str = "working"
    finish_at: float = 0.0
    input_pending: bool = False
    input_answered_at: float | None = None
    request_id: str = ""
    cancel_confirmed: bool = False
    updated: float = 0.0
    # Fault counters: each fault fires a bounded number of times.
    fired: dict[str, int] = field(default_factory=dict)
    reported_terminal: bool = False
    forgotten: bool = False  # the forget_before_ttl fault fired: 404 for good, truth kept

    def fire(self, name: str, times: int = 1) -> bool:
        n = self.fired.get(name, 0)
        if n >= times:
            return False
        self.fired[name] = n + 1
        return True


def iso(t: float) -> str:
    return (EPOCH + timedelta(seconds=t)).isoformat().replace("+00:00", "Z")


class SimServer:
    """One simulated tool server (its own tasks, session and counters)."""

    def __init__(self, *, name: str, clock: Callable[[], float], poll_interval_ms: int,
                 lie_about: frozenset[str] = frozenset()) -> None:
        self.name = name
        self.clock = clock
        self.poll_interval_ms = poll_interval_ms
        self.session = f"sess-{name}"
        self.tasks: dict[str, SimTask] = {}
        self.by_key: dict[str, str] = {}
        self.created_per_key: dict[str, int] = defaultdict(int)
        self.fenced: set[str] = set()
        self.unsent_dropped: set[int] = set()
        self.plans: dict[str, SeriesPlan] = {}  # submission key -> plan, set by the runner
        self.requests_per_second: dict[int, int] = defaultdict(int)
        self.methods_per_second: dict[int, list[str]] = defaultdict(list)
        self.polls_per_second: dict[int, int] = defaultdict(int)
        self.lock = threading.Lock()
        self._seq = 0
        # Test hook: keys whose ground truth this server misreports (a lying server).
        self.lie_about = lie_about
        # Called (outside the lock) with a submission key while a tasks/get answer for that task
        # is in flight: the runner rolls the row's epoch there (the epoch_roll fault).
        self.on_answer_in_flight: Callable[[str], None] | None = None
        # Whether the request being answered is a dispatcher poll (the runner knows, per thread):
        # the roll models a worker of the old epoch holding an observation, nothing else.
        self.may_roll: Callable[[], bool] = lambda: False
        self._in_flight = threading.local()

    # -- ground truth ------------------------------------------------------------------

    def _advance(self, task: SimTask) -> None:
        now = self.clock()
        if task.status in TERMINAL:
            return
        plan = task.plan
        if plan.input_after_s is not None and task.input_answered_at is None and not task.input_pending \
                and now >= task.created + plan.input_after_s:
            task.input_pending = True
            task.status = "input_required"
            task.updated = task.created + plan.input_after_s
            return
        if task.input_pending:
            return
        if now >= task.finish_at:
            task.status = plan.outcome
            task.updated = task.finish_at

    def truth(self, *, as_reported: bool = False, keys: Iterable[str] | None = None) -> dict[str, str]:
        """submission key -> the terminal status a receipt must carry.

        `as_reported`: what the server itself shows (its console, for the simulated operator);
        it differs from the truth only for keys this server lies about. `keys`: only these (the
        operator looks up a few items every virtual second; all 10,000 would dominate the run)."""
        with self.lock:
            out = {}
            if keys is None:
                tasks: Iterable[SimTask] = self.tasks.values()
            else:
                tasks = [self.tasks[self.by_key[k]] for k in keys if k in self.by_key]
            for task in tasks:
                self._advance(task)
                status = "cancelled" if task.cancel_confirmed else task.status
                if task.key in self.lie_about and status in TERMINAL and not as_reported:
                    status = "failed" if status == "completed" else "completed"
                out[task.key] = status
            return out

    def task_ids(self, *, keys: Iterable[str]) -> dict[str, str]:
        """submission key -> this server's task id, for the keys it holds a task for (its console)."""
        with self.lock:
            return {k: self.by_key[k] for k in keys if k in self.by_key}

    # -- protocol ----------------------------------------------------------------------

    def _task_json(self, task: SimTask, *, status: str | None = None, task_id: str | None = None
                   ) -> dict[str, Any]:
        return {"taskId": task_id or task.task_id, "status": status or task.status,
                "createdAt": iso(task.created), "lastUpdatedAt": iso(max(task.updated, task.created)),
                "ttl": task.ttl_ms, "pollInterval": self.poll_interval_ms}

    def _expired(self, task: SimTask) -> bool:
        return self.clock() > task.created + task.ttl_ms / 1000.0

    def _find(self, params: dict[str, Any]) -> SimTask | None:
        task = self.tasks.get(str(params.get("taskId")))
        if task is None or self._expired(task):
            return None
        self._advance(task)
        if task.plan.forget_before_ttl and task.status in TERMINAL and not task.reported_terminal:
            task.forgotten = True  # finished, then forgotten well before its ttl
        return None if task.forgotten else task

    def handle(self, request: httpx.Request) -> httpx.Response:
        self._in_flight.key = None
        response = self._handle(request)
        key, self._in_flight.key = self._in_flight.key, None
        if key is not None and self.on_answer_in_flight is not None:
            self.on_answer_in_flight(key)  # the answer is built, not yet read by the adapter
        return response

    def _handle(self, request: httpx.Request) -> httpx.Response:
        now = self.clock()
        with self.lock:
            self.requests_per_second[int(now)] += 1
            if request.url.path == "/_sim/keys":
                self.methods_per_second[int(now)].append("lookup")
                return self._lookup(json.loads(request.content))
            body = json.loads(request.content)
            self.methods_per_second[int(now)].append(str(body.get("method", "response")))
            if body.get("method") == "tasks/get":
                self.polls_per_second[int(now)] += 1
            if "method" not in body:
                return self._input_answer(body)
            method, params, rid = body["method"], body.get("params") or {}, body.get("id")
            if rid is None:
                return httpx.Response(202)
            handler = getattr(self, "_m_" + method.replace("/", "_"), None)
            if handler is None:
                return _error(rid, -32601, "method not found")
            result: httpx.Response = handler(rid, params)
            return result

    def _m_initialize(self, rid: Any, params: dict[str, Any]) -> httpx.Response:
        caps = {"tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}},
                "tools": {}, "experimental": {KEY_META: {"lookup": {"path": "/_sim/keys", "fences": True}}}}
        return _ok(rid, {"protocolVersion": PROTOCOL, "capabilities": caps,
                         "serverInfo": {"name": self.name, "version": "sim"}},
                   headers={"mcp-session-id": self.session})

    def _m_tools_list(self, rid: Any, params: dict[str, Any]) -> httpx.Response:
        return _ok(rid, {"tools": [{"name": TOOL, "inputSchema": {"type": "object"},
                                    "execution": {"taskSupport": "required"}}]})

    def _m_tools_call(self, rid: Any, params: dict[str, Any]) -> httpx.Response:
        key = str((params.get("_meta") or {}).get(KEY_META))
        plan = self.plans[key]
        if plan.lost_create == "unsent" and plan.index not in self.unsent_dropped:
            self.unsent_dropped.add(plan.index)  # once per series: the second attempt arrives
            raise httpx.ReadError("simulated: request lost before the server")
        if key in self.fenced:
            return _error(rid, INVALID_PARAMS, "submission key fenced by an earlier lookup")
        if key in self.by_key:  # the cooperating dedup: one task per key
            task = self.tasks[self.by_key[key]]
        else:
            now = self.clock()
            self._seq += 1
            ttl = int((params.get("task") or {}).get("ttl") or 3_600_000)
            task = SimTask(task_id=f"{self.name}-t{self._seq}", key=key, plan=plan, created=now,
                           ttl_ms=ttl, finish_at=now + plan.work_s, updated=now)
            task.request_id = f"elicit-{task.task_id}"
            self.tasks[task.task_id] = task
            self.by_key[key] = task.task_id
            self.created_per_key[key] += 1
            self._advance(task)
        if plan.lost_create == "after" and task.fire("lost_create"):
            raise httpx.ReadError("simulated: create reply lost")
        return _ok(rid, {"task": self._task_json(task)})

    def _m_tasks_get(self, rid: Any, params: dict[str, Any]) -> httpx.Response:
        task = self._find(params)
        if task is None:
            return _error(rid, INVALID_PARAMS, "unknown task")
        plan = task.plan
        if plan.throttle and task.fire("throttle", plan.throttle_times):
            return httpx.Response(plan.throttle, headers={"retry-after": "1"}, json={})
        if plan.wrong_task_id and task.fire("wrong_id"):
            return _ok(rid, self._task_json(task, task_id=task.task_id + "-other"))
        if plan.foreign_task_id and task.fire("foreign_id"):
            # A terminal answer naming a task of another server's session: nothing may advance.
            return _ok(rid, self._task_json(task, status="completed",
                                            task_id=f"{self.name}-peer-t{self._seq}"))
        if plan.epoch_roll and task.status == "working" and self.may_roll() \
                and task.fire("epoch_roll"):
            self._in_flight.key = task.key
        if plan.stale_after_terminal and task.status in TERMINAL and task.reported_terminal \
                and task.fire("stale"):
            return _ok(rid, self._task_json(task, status="working"))  # an out-of-order answer
        if plan.replay_input and task.input_answered_at is not None and task.status == "working" \
                and task.fire("replay"):
            return _ok(rid, self._task_json(task, status="input_required"))
        if task.status in TERMINAL:
            task.reported_terminal = True
        return _ok(rid, self._task_json(task))

    def _m_tasks_result(self, rid: Any, params: dict[str, Any]) -> httpx.Response:
        task = self._find(params)
        if task is None:
            return _error(rid, INVALID_PARAMS, "unknown task")
        if task.status in TERMINAL:
            if task.plan.result_fault == "lost" and task.fire("result"):
                raise httpx.ReadError("simulated: tasks/result reply lost")
            meta = {RELATED: {"taskId": task.task_id}}
            if task.status == "completed":
                result = {"content": [{"type": "text", "text": f"done {task.key[:8]}"}],
                          "structuredContent": {"key": task.key}, "_meta": meta}
            else:
                result = {"_meta": meta}
            body = _sse([{"jsonrpc": "2.0", "id": rid, "result": result}])
            if task.plan.result_fault == "truncated" and task.fire("result"):
                body = body[: len(body) // 2]  # cut mid-event: the stream ends before the response
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)
        messages = []
        if task.input_pending or (task.plan.replay_input and task.input_answered_at is not None):
            messages.append({"jsonrpc": "2.0", "id": task.request_id, "method": "elicitation/create",
                             "params": {"mode": "form", "message": "confirm?",
                                        "requestedSchema": {"type": "object", "properties": {
                                            "ok": {"type": "boolean"}}, "required": ["ok"]},
                                        "_meta": {RELATED: {"taskId": task.task_id}}}})
        # The stream ends without the response: the adapter hands over what it read.
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=_sse(messages))

    def _input_answer(self, body: dict[str, Any]) -> httpx.Response:
        task_id = _related(body.get("result"))
        task = self.tasks.get(task_id or "")
        if task is None or body.get("id") != task.request_id:
            return httpx.Response(400, json={"error": {"code": INVALID_PARAMS, "message": "no such request"}})
        self._advance(task)
        if task.input_pending and task.status == "input_required":
            now = self.clock()
            task.input_pending = False
            task.input_answered_at = now
            task.status = "working"
            task.updated = now
            task.finish_at = now + max(task.plan.work_s - (task.plan.input_after_s or 0.0), 0.5)
        return httpx.Response(202)

    def _m_tasks_cancel(self, rid: Any, params: dict[str, Any]) -> httpx.Response:
        task = self._find(params)
        if task is None or task.status in TERMINAL:
            return _error(rid, INVALID_PARAMS, "task is already terminal or unknown")
        now = self.clock()
        task.status, task.cancel_confirmed, task.updated = "cancelled", True, now
        task.input_pending = False
        if task.plan.cancel_ack_lost and task.fire("cancel_ack"):
            raise httpx.ReadError("simulated: cancel acknowledgement lost")
        return _ok(rid, self._task_json(task))

    def _m_tasks_list(self, rid: Any, params: dict[str, Any]) -> httpx.Response:
        return _ok(rid, {"tasks": [self._task_json(t) for t in self.tasks.values()
                                     if not self._expired(t) and not t.forgotten]})

    def _lookup(self, body: dict[str, Any]) -> httpx.Response:
        key = str(body.get("key"))
        task_id = self.by_key.get(key)
        if task_id is None:
            self.fenced.add(key)  # a fencing lookup: a late tools/call with this key is refused
            return httpx.Response(404, json={"fenced": True})
        return httpx.Response(200, json={"taskId": task_id, "sameSession": True})


def _related(container: Any) -> str | None:
    meta = (container or {}).get("_meta") if isinstance(container, dict) else None
    related = (meta or {}).get(RELATED)
    return related.get("taskId") if isinstance(related, dict) else None


def _ok(rid: Any, result: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(200, json={"jsonrpc": "2.0", "id": rid, "result": result}, headers=headers)


def _error(rid: Any, code: int, message: str) -> httpx.Response:
    error = {"code": code, "message": message}
    return httpx.Response(200, json={"jsonrpc": "2.0", "id": rid, "error": error})


def _sse(messages: list[dict[str, Any]]) -> bytes:
    return "".join(f"event: message\ndata: {json.dumps(m)}\n\n" for m in messages).encode()


class SimTransport(httpx.BaseTransport):
    """In-process transport: requests go straight to the SimServer's handler."""

    def __init__(self, server: SimServer) -> None:
        self.server = server

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        return self.server.handle(request)
