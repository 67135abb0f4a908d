"""Reference server for Shape B: the `io.modelcontextprotocol/tasks` extension (SEP-2663).

Built on FastMCP 4.1 + fastmcp-tasks 4.1.4, the Python reference implementation of the
extension. Those need mcp 2.x, which the project's own venv cannot hold next to mcp 1.30
(the Shape A peer), so this file runs ONLY from the separate venv that
`tests/peers/ext_venv.py` builds; the project never imports it.

Tools (all `task=TaskConfig(mode="required")`, so the server always answers with a task):
* sleep_then_complete(seconds, value)  -> completed, text `value`
* sleep_then_fail(seconds)             -> failed: a protocol error (MCPError) is inlined as `error`
* sleep_then_is_error(seconds)         -> completed with isError:true (SEP-2663: not `failed`)
* ask_input(question)                  -> input_required (guard pattern), then "Hello, <answer>!"
* quick_sync(value)                    -> a plain tool (no task): the synchronous answer
`/_peer/stats` counts tool-body runs per tool (the extension re-runs a body per input leg).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from datetime import timedelta

import mcp_types
from fastmcp import Context, FastMCP
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks import TasksExtension
from mcp.shared.exceptions import MCPError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

RUNS: Counter[str] = Counter()


def build(poll_interval_ms: int, *, tasks: bool = True) -> FastMCP:
    mcp = FastMCP("toolops-ext-peer")
    _add_common(mcp)
    if not tasks:
        # A 2026-07-28 server without the extension: only the plain tool (FastMCP refuses
        # task tools without a TasksExtension at startup).
        return mcp
    mcp.add_extension(TasksExtension())
    task = TaskConfig(mode="required", poll_interval=timedelta(milliseconds=poll_interval_ms))

    @mcp.tool(task=task)
    async def sleep_then_complete(seconds: float = 0.2, value: str = "done") -> str:
        RUNS["sleep_then_complete"] += 1
        await asyncio.sleep(seconds)
        return value

    @mcp.tool(task=task)
    async def sleep_then_fail(seconds: float = 0.2) -> str:
        RUNS["sleep_then_fail"] += 1
        await asyncio.sleep(seconds)
        # A protocol fault: the only thing SEP-2663 reports as `failed` (with `error` inline).
        raise MCPError(code=-32000, message="deliberate failure")

    @mcp.tool(task=task)
    async def sleep_then_is_error(seconds: float = 0.2) -> str:
        RUNS["sleep_then_is_error"] += 1
        await asyncio.sleep(seconds)
        raise ValueError("tool-level error")

    @mcp.tool(task=task)
    async def ask_input(ctx: Context, question: str = "Name?") -> object:
        RUNS["ask_input"] += 1
        answers = ctx.input_responses or {}
        answer = answers.get("name")
        if answer is None:
            # Guard pattern: return the ask; the next leg runs with ctx.input_responses.
            request = mcp_types.ElicitRequest(
                params=mcp_types.ElicitRequestFormParams(
                    message=question,
                    requested_schema={"type": "object", "properties": {"name": {"type": "string"}},
                                      "required": ["name"]},
                )
            )
            return mcp_types.InputRequiredResult(input_requests={"name": request})
        content = getattr(answer, "content", None) or {}
        return f"Hello, {content.get('name')}!"

    @mcp.tool(task=task)
    async def ask_rounds(ctx: Context, question: str = "Value?", rounds: int = 2) -> object:
        """Ask `rounds` questions, one per leg; answers so far ride in `request_state`."""
        RUNS["ask_rounds"] += 1
        state = json.loads(ctx.request_state) if ctx.request_state else {"answers": []}
        answers: list[str] = list(state["answers"])
        answer = (ctx.input_responses or {}).get(f"r{len(answers) + 1}")
        if answer is not None:
            answers.append(str((getattr(answer, "content", None) or {}).get("value")))
        if len(answers) >= rounds:
            return "answers: " + ",".join(answers)
        key = f"r{len(answers) + 1}"  # minted per round, never reused
        request = mcp_types.ElicitRequest(
            params=mcp_types.ElicitRequestFormParams(
                message=f"{question} ({len(answers) + 1}/{rounds})",
                requested_schema={"type": "object", "properties": {"value": {"type": "string"}},
                                  "required": ["value"]},
            )
        )
        return mcp_types.InputRequiredResult(input_requests={key: request},
                                             request_state=json.dumps({"answers": answers}))

    return mcp


def _add_common(mcp: FastMCP) -> None:
    @mcp.tool
    def quick_sync(value: str = "sync") -> str:
        RUNS["quick_sync"] += 1
        return value

    @mcp.custom_route("/_peer/stats", methods=["GET"])
    async def stats(request: Request) -> Response:
        return JSONResponse({"runs": dict(RUNS)})


def _set_execution_ttl(ttl: timedelta) -> None:
    """Shorten Docket's retention of finished tasks so expiry is testable in seconds.

    fastmcp-tasks exposes no setting for it (always 15 min); Docket takes `execution_ttl`
    in its constructor, so the peer supplies a default there.
    """
    import docket.docket as docket_module

    original = docket_module.Docket.__init__

    def init(self: object, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("execution_ttl", ttl)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    docket_module.Docket.__init__ = init  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--poll-interval-ms", type=int, default=100)
    parser.add_argument("--execution-ttl-ms", type=int, default=None)
    parser.add_argument("--no-tasks", action="store_true", help="serve without the tasks extension")
    args = parser.parse_args()
    if args.execution_ttl_ms is not None:
        _set_execution_ttl(timedelta(milliseconds=args.execution_ttl_ms))
    build(args.poll_interval_ms, tasks=not args.no_tasks).run(
        transport="http", host=args.host, port=args.port, path="/mcp", show_banner=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
