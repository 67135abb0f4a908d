"""Reference MCP peer: the official `mcp` 1.30 SDK with its experimental task support.

The SDK speaks the protocol (initialize, tools/*, tasks/*, Streamable HTTP, sessions);
this module only declares tools, runs their work through `ctx.experimental.run_task`
and adds a few plain HTTP routes under `/_peer/` so tests can count what the server saw.

Run: python -m tests.peers.mcp_server --port PORT [--host 127.0.0.1] [--cooperating [full|dedup]]
     [--poll-interval-ms N]
MCP endpoint: /mcp. Test-only routes: GET /_peer/stats, POST /_peer/reset, GET /_peer/lookup?key=K.
Cooperating mode declares `capabilities.experimental["io.toolops/submission-key"]`: `dedup`
(tools/call with a key already used in this session answers the same task, never a second one)
and, in `full` mode, `lookup` (POST /_peer/keys {"key"}: the task for the key, or a 404 that
FENCES the key so that a late tools/call carrying it is refused: proof that nothing exists).
"""

from __future__ import annotations

import argparse
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import uvicorn
from anyio.abc import TaskGroup
from mcp import types
from mcp.server.experimental.task_context import ServerTaskContext
from mcp.server.experimental.task_support import TaskSupport
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.experimental.tasks.helpers import is_terminal
from mcp.shared.experimental.tasks.in_memory_task_store import InMemoryTaskStore
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

# The whole experimental tasks API is deprecated in 1.30 (removal planned for mcp 2.0);
# we use it on purpose, so keep the warning out of the test logs.
warnings.filterwarnings("ignore", category=DeprecationWarning, module=__name__)

SUBMISSION_KEY_META = "io.toolops/submission-key"
ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"value": {"type": "string"}},
    "required": ["value"],
}

_REQUIRED = types.ToolExecution(taskSupport="required")


def _schema(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required}


# Tool names and argument shapes are a contract shared with the client-side code under test.
TOOLS: dict[str, types.Tool] = {
    t.name: t
    for t in [
        types.Tool(
            name="sleep_then_complete",
            description="Sleep `seconds`, then complete with `value`.",
            inputSchema=_schema(
                {"seconds": {"type": "number"}, "value": {"type": "string"}}, ["seconds", "value"]
            ),
            execution=_REQUIRED,
        ),
        types.Tool(
            name="sleep_then_fail",
            description="Sleep `seconds`, then raise: the task ends `failed`.",
            inputSchema=_schema(
                {"seconds": {"type": "number"}, "message": {"type": "string"}}, ["seconds", "message"]
            ),
            execution=_REQUIRED,
        ),
        types.Tool(
            name="sleep_then_is_error",
            description="Sleep `seconds`, then return a CallToolResult with isError=true.",
            inputSchema=_schema(
                {"seconds": {"type": "number"}, "message": {"type": "string"}}, ["seconds", "message"]
            ),
            execution=_REQUIRED,
        ),
        types.Tool(
            name="ask_input",
            description="Ask `rounds` elicitation questions through the task, then report the answers.",
            inputSchema=_schema(
                {"question": {"type": "string"}, "rounds": {"type": "integer", "minimum": 1, "default": 1}},
                ["question"],
            ),
            execution=_REQUIRED,
        ),
        # No `execution` at all: the SDK's default, i.e. taskSupport "forbidden".
        types.Tool(
            name="quick_sync",
            description="Return `value` immediately (no task support).",
            inputSchema=_schema({"value": {"type": "string"}}, ["value"]),
        ),
        # Optional task support: callable synchronously (within a published bound) or as a task,
        # so the same call can take the legacy or the new path (issue 9 canary and shadow).
        types.Tool(
            name="read_value",
            description="Sleep `seconds`, then return `value`. Reads only: no side effects.",
            inputSchema=_schema(
                {"seconds": {"type": "number"}, "value": {"type": "string"}}, ["seconds", "value"]
            ),
            execution=types.ToolExecution(taskSupport="optional"),
            annotations=types.ToolAnnotations(readOnlyHint=True),
        ),
        types.Tool(
            name="write_value",
            description="Sleep `seconds`, then 'write' `value` (a side effect, counted).",
            inputSchema=_schema(
                {"seconds": {"type": "number"}, "value": {"type": "string"}}, ["seconds", "value"]
            ),
            execution=types.ToolExecution(taskSupport="optional"),
            annotations=types.ToolAnnotations(readOnlyHint=False, destructiveHint=False),
        ),
        types.Tool(
            name="slow_sync",
            description="Sleep `seconds`, then return 'done' (no task support).",
            inputSchema=_schema({"seconds": {"type": "number"}}, ["seconds"]),
        ),
    ]
}


def _text(
    text: str, *, structured: dict[str, Any] | None = None, is_error: bool = False
) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structuredContent=structured, isError=is_error
    )


class PeerTaskStore(InMemoryTaskStore):
    """The SDK's in-memory store with two adjustments.

    * `pollInterval` is hard-coded to 500 ms in `create_task_state`; we overwrite it when
      `--poll-interval-ms` is given.
    * Stock 1.30 lets `tasks/cancel` mark a task cancelled while its work keeps running.
      When that work ends, `run_task` calls `complete()` -> `update_task` raises
      "Cannot transition from terminal status" -> `fail()` raises the same, and the
      exception escapes into the SDK's task group. We make late writes to a terminal task
      no-ops instead, so a cancelled task stays `cancelled` with no result, and the
      work itself is stopped by `PeerState.cancel_scopes` (see `_run_work`).
    """

    def __init__(self, poll_interval_ms: int | None, on_cancel: Callable[[str], None]) -> None:
        super().__init__()
        self._poll_interval_ms = poll_interval_ms
        self._on_cancel = on_cancel

    async def create_task(self, metadata: types.TaskMetadata, task_id: str | None = None) -> types.Task:
        task = await super().create_task(metadata, task_id)
        if self._poll_interval_ms is not None:
            self._tasks[task.taskId].task.pollInterval = self._poll_interval_ms
            task = task.model_copy(update={"pollInterval": self._poll_interval_ms})
        return task

    async def update_task(
        self, task_id: str, status: types.TaskStatus | None = None, status_message: str | None = None
    ) -> types.Task:
        stored = self._tasks.get(task_id)
        if stored is not None and is_terminal(stored.task.status):
            return types.Task(**stored.task.model_dump())  # terminal is final: ignore late writes
        task = await super().update_task(task_id, status=status, status_message=status_message)
        if status == types.TASK_STATUS_CANCELLED:
            self._on_cancel(task_id)
        return task

    async def store_result(self, task_id: str, result: types.Result) -> None:
        stored = self._tasks.get(task_id)
        if stored is not None and is_terminal(stored.task.status):
            return  # don't attach a late result to a cancelled task
        await super().store_result(task_id, result)


@dataclass
class PeerState:
    """Server-side counters and the cooperating-mode dedup index."""

    cooperating: bool = False
    lookup: bool = False  # cooperating "full": also offer the fencing key lookup
    tasks_created: int = 0
    # Keys a lookup declared unknown: a late tools/call with one of them is refused.
    fenced: set[str] = field(default_factory=set)
    refused_fenced: int = 0
    tool_calls: Counter[str] = field(default_factory=Counter)
    submission_keys: Counter[str] = field(default_factory=Counter)
    # (Mcp-Session-Id, submission key) -> taskId, for dedup within a session.
    dedup: dict[tuple[str, str], str] = field(default_factory=dict)
    # submission key -> [(Mcp-Session-Id, taskId)], newest last, for /_peer/lookup.
    by_key: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    # taskId -> cancel scope of its running work, so tasks/cancel can stop it.
    cancel_scopes: dict[str, anyio.CancelScope] = field(default_factory=dict)
    lock: anyio.Lock | None = None

    def reset(self) -> None:
        self.tasks_created = 0
        self.tool_calls.clear()
        self.submission_keys.clear()
        self.dedup.clear()
        self.by_key.clear()
        self.fenced.clear()
        self.refused_fenced = 0

    def cancel_work(self, task_id: str) -> None:
        scope = self.cancel_scopes.get(task_id)
        if scope is not None:
            scope.cancel()

    def snapshot(self) -> dict[str, Any]:
        return {
            "tasks_created": self.tasks_created,
            "tool_calls": dict(self.tool_calls),
            "submission_keys": dict(self.submission_keys),
            "cooperating": self.cooperating,
            "refused_fenced": self.refused_fenced,
        }


Work = Callable[[ServerTaskContext], Awaitable[types.Result]]


def _work_for(name: str, args: dict[str, Any]) -> Work:
    """The body that runs inside the task (after `tools/call` has already answered)."""

    async def sleep_then_complete(_: ServerTaskContext) -> types.Result:
        await anyio.sleep(float(args["seconds"]))
        return _text(args["value"], structured={"value": args["value"]})

    async def sleep_then_fail(_: ServerTaskContext) -> types.Result:
        await anyio.sleep(float(args["seconds"]))
        raise RuntimeError(args["message"])  # run_task turns this into status "failed"

    async def sleep_then_is_error(_: ServerTaskContext) -> types.Result:
        await anyio.sleep(float(args["seconds"]))
        return _text(args["message"], is_error=True)

    async def ask_input(task: ServerTaskContext) -> types.Result:
        rounds = int(args.get("rounds", 1))
        answers: list[str] = []
        for i in range(rounds):
            message = args["question"] if rounds == 1 else f"{args['question']} ({i + 1}/{rounds})"
            # SDK path: status -> input_required, request queued for the tasks/result stream,
            # tagged with related-task _meta; resolves when the client POSTs its response.
            reply = await task.elicit(message=message, requestedSchema=ANSWER_SCHEMA)
            if reply.action != "accept" or not reply.content or "value" not in reply.content:
                return _text(f"input {reply.action}", structured={"answers": answers}, is_error=True)
            answers.append(str(reply.content["value"]))
        return _text("answers: " + ",".join(answers), structured={"answers": answers})

    async def sleep_then_value(_: ServerTaskContext) -> types.Result:
        await anyio.sleep(float(args["seconds"]))
        return _text(args["value"], structured={"value": args["value"]})

    bodies: dict[str, Work] = {
        "read_value": sleep_then_value,
        "write_value": sleep_then_value,
        "sleep_then_complete": sleep_then_complete,
        "sleep_then_fail": sleep_then_fail,
        "sleep_then_is_error": sleep_then_is_error,
        "ask_input": ask_input,
    }
    return bodies[name]


def build_server(state: PeerState, poll_interval_ms: int | None) -> tuple[Server[Any, Any], TaskSupport]:
    server: Server[Any, Any] = Server("toolops-reference-peer", version="1.0.0")
    store = PeerTaskStore(poll_interval_ms, on_cancel=state.cancel_work)
    # Registers the SDK's default tasks/get, tasks/result, tasks/list, tasks/cancel handlers
    # and makes initialize advertise capabilities.tasks.{list,cancel,requests.tools.call}.
    support = server.experimental.enable_tasks(store=store)

    @server.list_tools()
    async def list_tools() -> list[types.Tool]:
        return list(TOOLS.values())

    @server.call_tool()
    async def call_tool(
        name: str, arguments: dict[str, Any]
    ) -> types.CallToolResult | types.CreateTaskResult:
        ctx = server.request_context
        meta = ctx.meta.model_extra if ctx.meta is not None and ctx.meta.model_extra else {}
        key = meta.get(SUBMISSION_KEY_META)
        key = str(key) if key is not None else None
        session_id = ctx.request.headers.get("mcp-session-id", "") if ctx.request is not None else ""
        state.tool_calls[name] += 1
        if key is not None:
            state.submission_keys[key] += 1

        tool = TOOLS.get(name)
        if tool is None:
            return _text(f"Unknown tool: {name}", is_error=True)
        # The lowlevel server does not enforce taskSupport; the SDK helper raises McpError
        # (-32601), which call_tool's wrapper turns into an isError CallToolResult.
        ctx.experimental.validate_for_tool(tool)

        if name == "quick_sync":
            return _text(arguments["value"])
        if name == "slow_sync":
            await anyio.sleep(float(arguments["seconds"]))
            return _text("done")
        if name in ("read_value", "write_value") and not ctx.experimental.is_task:
            await anyio.sleep(float(arguments["seconds"]))  # the synchronous (legacy) answer
            return _text(arguments["value"], structured={"value": arguments["value"]})

        work = _work_for(name, arguments)
        if state.lock is None:
            state.lock = anyio.Lock()
        async with state.lock:  # serialise check-and-create so concurrent duplicates dedup too
            if state.cooperating and key is not None:
                if key in state.fenced:
                    state.refused_fenced += 1
                    return _text("submission key was declared unknown and fenced", is_error=True)
                existing_id = state.dedup.get((session_id, key))
                if existing_id is not None:
                    existing = await support.store.get_task(existing_id)
                    if existing is None:
                        # The key's task expired: creating another would be a second operation.
                        return _text("the task for this submission key is gone", is_error=True)
                    return types.CreateTaskResult(task=existing)
            created = await ctx.experimental.run_task(_run_work(state, work))
            state.tasks_created += 1
            if key is not None:
                state.by_key.setdefault(key, []).append((session_id, created.task.taskId))
                if state.cooperating:
                    state.dedup[(session_id, key)] = created.task.taskId
        return created

    if state.cooperating:
        declared: dict[str, Any] = {"dedup": {"scope": "session", "retentionMs": None}}
        if state.lookup:
            declared["lookup"] = {"path": "/_peer/keys", "fences": True}
        plain_options = server.create_initialization_options

        def with_submission_key(*args: Any, **kwargs: Any) -> Any:
            kwargs["experimental_capabilities"] = {SUBMISSION_KEY_META: declared}
            return plain_options(*args, **kwargs)

        server.create_initialization_options = with_submission_key  # type: ignore[method-assign]
    return server, support


def _run_work(state: PeerState, work: Work) -> Work:
    """Run `work` inside a cancel scope registered under its task id, so that a
    tasks/cancel (seen by PeerTaskStore.update_task) actually stops it."""

    async def wrapped(task: ServerTaskContext) -> types.Result:
        with anyio.CancelScope() as scope:
            state.cancel_scopes[task.task_id] = scope
            try:
                return await work(task)
            finally:
                state.cancel_scopes.pop(task.task_id, None)
        # Only reached when the scope was cancelled: the task is already `cancelled`.
        # run_task still calls complete() (its Task copy is stale); PeerTaskStore drops it.
        return _text("cancelled", is_error=True)

    return wrapped


def _pin_task_group(support: TaskSupport) -> Callable[[TaskGroup], None]:
    """Run all task work in one server-wide task group instead of a per-session one.

    Stock 1.30 keeps a single `TaskSupport._task_group` for the whole server but every
    session's `Server.run()` enters `support.run()`, which overwrites it on start and sets
    it to None when that session ends. With several sessions, work runs in whichever
    session started last, and once any session ends (DELETE, idle timeout) `run_task`
    in every other session fails with "TaskSupport not running". Replacing the instance's
    `run` with a no-op and pinning the group avoids that; the protocol path is unchanged.
    """

    @asynccontextmanager
    async def no_op_run() -> AsyncIterator[None]:
        yield

    support.run = no_op_run  # type: ignore[method-assign]

    def pin(tg: TaskGroup) -> None:
        support._task_group = tg  # pyright: ignore[reportPrivateUsage]

    return pin


def build_app(
    *, cooperating: bool | str = False, poll_interval_ms: int | None = None
) -> Starlette:
    state = PeerState(cooperating=bool(cooperating), lookup=cooperating in (True, "full"))
    server, support = build_server(state, poll_interval_ms)
    pin_task_group = _pin_task_group(support)
    # Stateful (the default): tasks are bound to the MCP session that created them.
    manager = StreamableHTTPSessionManager(app=server, stateless=False)

    class McpEndpoint:
        # A class instance (not a function) so Starlette's Route treats it as a raw ASGI
        # app for every HTTP method (POST, GET stream, DELETE) instead of a GET-only view.
        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            await manager.handle_request(scope, receive, send)

    async def stats(_: Request) -> JSONResponse:
        return JSONResponse(state.snapshot())

    async def reset(_: Request) -> JSONResponse:
        state.reset()
        return JSONResponse(state.snapshot())

    async def lookup(request: Request) -> JSONResponse:
        # Out-of-band "did you already create a task for this key?" query: only a
        # cooperating server offers it. Optional `session` narrows it to one MCP session.
        if not state.cooperating:
            return JSONResponse({"error": "lookup is only available with --cooperating"}, status_code=404)
        key = request.query_params.get("key", "")
        session = request.query_params.get("session")
        hits = [(s, t) for s, t in state.by_key.get(key, []) if session is None or s == session]
        if not hits:
            return JSONResponse({"error": "unknown submission key"}, status_code=404)
        session_id, task_id = hits[-1]
        return JSONResponse({"taskId": task_id, "sessionId": session_id})

    async def keys(request: Request) -> JSONResponse:
        # The declared lookup: scoped to the caller's session (tasks are session-bound), and a
        # miss fences the key under the same lock tools/call creates under, so no late request
        # can create a task after this answer said "none".
        if not state.lookup:
            return JSONResponse({"error": "no submission-key lookup offered"}, status_code=404)
        body = await request.json()
        key = str(body.get("key", "")) if isinstance(body, dict) else ""
        session = request.headers.get("mcp-session-id", "")
        if state.lock is None:
            state.lock = anyio.Lock()
        async with state.lock:
            hits = state.by_key.get(key, [])
            if not hits:
                state.fenced.add(key)
                return JSONResponse({"error": "unknown submission key", "fenced": True}, status_code=404)
        mine = [t for s, t in hits if s == session]
        task_id = mine[-1] if mine else hits[-1][1]
        return JSONResponse({"taskId": task_id, "sameSession": bool(mine)})

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            pin_task_group(tg)
            async with manager.run():
                yield
            tg.cancel_scope.cancel()  # shutting down: abandon still-running task work

    return Starlette(
        routes=[
            Route("/mcp", endpoint=McpEndpoint()),
            Route("/_peer/stats", endpoint=stats, methods=["GET"]),
            Route("/_peer/reset", endpoint=reset, methods=["POST"]),
            Route("/_peer/lookup", endpoint=lookup, methods=["GET"]),
            Route("/_peer/keys", endpoint=keys, methods=["POST"]),
        ],
        lifespan=lifespan,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cooperating", nargs="?", const="full", default=None, choices=["full", "dedup"],
                        help="dedup tools/call by submission key (full: also the fencing lookup)")
    parser.add_argument("--poll-interval-ms", type=int, default=None, help="pollInterval advertised on tasks")
    args = parser.parse_args(argv)
    app = build_app(cooperating=args.cooperating or False, poll_interval_ms=args.poll_interval_ms)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()
