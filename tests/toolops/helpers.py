"""Plain helpers shared by the toolops tests (fixtures live in conftest.py)."""

from __future__ import annotations

import uuid

from ledger.models import Operation, ToolServer
from ledger.states import State
from toolops.services.submit import operation_submit


def submit_tool_call(server: ToolServer | str, tool: str, node: str, *,
                     ttl_ms: int | None = 60_000, **args: object) -> Operation:
    """Submit `tool` (on a server row or by its name) for call node `node`, with keyword `args`
    as its arguments."""
    name = server if isinstance(server, str) else server.name
    return operation_submit(server_name=name, tool_name=tool, call_node_id=node,
                            arguments=dict(args), ttl_ms=ttl_ms)


def submit_sleep(server: ToolServer | str, *, node: str | None = None, value: str | None = None,
                 seconds: float = 0.2, ttl_ms: int = 60_000,
                 expect: State | None = None) -> Operation:
    """Submit the reference server's `sleep_then_complete` (it completes with `value` after
    `seconds`). `node` defaults to a fresh call node, `value` to the node; `expect` asserts the
    state the submit left the row in."""
    node = node or f"sleep-{uuid.uuid4().hex[:10]}"
    op = submit_tool_call(server, "sleep_then_complete", node, ttl_ms=ttl_ms,
                          seconds=seconds, value=node if value is None else value)
    if expect is not None:
        assert op.state == expect, (op.state, expect)
    return op
