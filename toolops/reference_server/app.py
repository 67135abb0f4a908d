"""The reference server's MCP handlers and its Starlette app (Streamable HTTP at /mcp).

The SDK speaks the protocol (initialize, tools/*, tasks/*, Streamable HTTP, sessions); this module
wires the tools to `ctx.experimental.run_task` and adds plain HTTP inspection routes under
`/_peer/` (counters, reset, submission-key lookup) that the demo's checks and the tests read.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import uvicorn
from anyio.abc import TaskGroup
from mcp import types
from mcp.server.experimental.task_context import ServerTaskContext
from mcp.server.experimental.task_support import TaskSupport
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from toolops.reference_server.store import PeerState, PeerTaskStore
from toolops.reference_server.tools import SUBMISSION_KEY_META, TOOLS, Work, text_result, work_for


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
            return text_result(f"Unknown tool: {name}", is_error=True)
        # The lowlevel server does not enforce taskSupport; the SDK helper raises McpError
        # (-32601), which call_tool's wrapper turns into an isError CallToolResult.
        ctx.experimental.validate_for_tool(tool)

        if name == "quick_sync":
            return text_result(arguments["value"])
        if name == "slow_sync":
            await anyio.sleep(float(arguments["seconds"]))
            return text_result("done")
        if name in ("read_value", "write_value") and not ctx.experimental.is_task:
            await anyio.sleep(float(arguments["seconds"]))  # the synchronous (legacy) answer
            return text_result(arguments["value"], structured={"value": arguments["value"]})

        work = work_for(name, arguments)
        if state.lock is None:
            state.lock = anyio.Lock()
        async with state.lock:  # serialise check-and-create so concurrent duplicates dedup too
            if state.cooperating and key is not None:
                if key in state.fenced:
                    state.refused_fenced += 1
                    return text_result("submission key was declared unknown and fenced", is_error=True)
                existing_id = state.dedup.get((session_id, key))
                if existing_id is not None:
                    existing = await support.store.get_task(existing_id)
                    if existing is None:
                        # The key's task expired: creating another would be a second operation.
                        return text_result("the task for this submission key is gone", is_error=True)
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
        return text_result("cancelled", is_error=True)

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
    parser = argparse.ArgumentParser(
        prog="python -m toolops.reference_server",
        description="Reference MCP server: the official mcp SDK with tasks (2025-11-25).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cooperating", nargs="?", const="full", default=None, choices=["full", "dedup"],
                        help="dedup tools/call by submission key (full: also the fencing lookup)")
    parser.add_argument("--poll-interval-ms", type=int, default=None, help="pollInterval advertised on tasks")
    args = parser.parse_args(argv)
    app = build_app(cooperating=args.cooperating or False, poll_interval_ms=args.poll_interval_ms)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", lifespan="on")
