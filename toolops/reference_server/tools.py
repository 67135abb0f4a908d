"""The reference server's tools: their declarations (names, schemas, task support) and bodies.

Tool names and argument shapes are a contract shared with the client-side code: the demo and the
tests submit these tools by name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from mcp import types
from mcp.server.experimental.task_context import ServerTaskContext

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
                {"question": {"type": "string"}, "rounds": {"type": "integer", "minimum": 1, "default": 1},
                 "numbered": {"type": "boolean", "default": True},
                 "same_request_id": {"type": "boolean", "default": False}},
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
        # so the same call can take the legacy or the new path (the canary and shadow rollout).
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


def text_result(
    text: str, *, structured: dict[str, Any] | None = None, is_error: bool = False
) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structuredContent=structured, isError=is_error
    )



Work = Callable[[ServerTaskContext], Awaitable[types.Result]]

# Tasks whose every input request carries one id (see _pin_request_ids).
_PINNED_TASKS: set[str] = set()


def _pin_request_ids(task: ServerTaskContext) -> None:
    """Make the SDK's request-id reuse certain for this task.

    mcp 1.30 names a task's input request `task-<task id>-<id(params)>`; CPython hands a freed
    object's address to the next one, so a later round often, not always, carries an earlier
    round's id. Pinning the suffix lets a test meet that on every run instead of by chance. The
    session's own builder still builds the request; only its id is fixed.
    """
    _PINNED_TASKS.add(task.task_id)
    session: Any = task._session  # the session whose builder the SDK's elicit() calls
    if getattr(session, "_toolops_pinned_ids", False):
        return
    build = session._build_elicit_form_request

    def build_pinned(*a: Any, **kw: Any) -> types.JSONRPCRequest:
        request: types.JSONRPCRequest = build(*a, **kw)
        related = kw.get("related_task_id")
        if related in _PINNED_TASKS:
            request.id = f"task-{related}-pinned"
        return request

    session._build_elicit_form_request = build_pinned
    session._toolops_pinned_ids = True


def work_for(name: str, args: dict[str, Any]) -> Work:
    """The body that runs inside the task (after `tools/call` has already answered)."""

    async def sleep_then_complete(_: ServerTaskContext) -> types.Result:
        await anyio.sleep(float(args["seconds"]))
        return text_result(args["value"], structured={"value": args["value"]})

    async def sleep_then_fail(_: ServerTaskContext) -> types.Result:
        await anyio.sleep(float(args["seconds"]))
        raise RuntimeError(args["message"])  # run_task turns this into status "failed"

    async def sleep_then_is_error(_: ServerTaskContext) -> types.Result:
        await anyio.sleep(float(args["seconds"]))
        return text_result(args["message"], is_error=True)

    async def ask_input(task: ServerTaskContext) -> types.Result:
        rounds = int(args.get("rounds", 1))
        numbered = bool(args.get("numbered", True)) and rounds > 1
        if args.get("same_request_id"):
            _pin_request_ids(task)
        answers: list[str] = []
        try:
            for i in range(rounds):
                message = f"{args['question']} ({i + 1}/{rounds})" if numbered else args["question"]
                # SDK path: status -> input_required, request queued for the tasks/result stream,
                # tagged with related-task _meta; resolves when the client POSTs its response.
                reply = await task.elicit(message=message, requestedSchema=ANSWER_SCHEMA)
                if reply.action != "accept" or not reply.content or "value" not in reply.content:
                    return text_result(f"input {reply.action}", structured={"answers": answers},
                                       is_error=True)
                answers.append(str(reply.content["value"]))
        finally:
            _PINNED_TASKS.discard(task.task_id)  # the set lives as long as the server
        return text_result("answers: " + ",".join(answers), structured={"answers": answers})

    async def sleep_then_value(_: ServerTaskContext) -> types.Result:
        await anyio.sleep(float(args["seconds"]))
        return text_result(args["value"], structured={"value": args["value"]})

    bodies: dict[str, Work] = {
        "read_value": sleep_then_value,
        "write_value": sleep_then_value,
        "sleep_then_complete": sleep_then_complete,
        "sleep_then_fail": sleep_then_fail,
        "sleep_then_is_error": sleep_then_is_error,
        "ask_input": ask_input,
    }
    return bodies[name]
