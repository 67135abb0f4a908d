"""Plain helpers shared by the toolops tests (fixtures live in conftest.py)."""

from __future__ import annotations

from ledger.models import Operation, ToolServer
from toolops.services.submit import operation_submit


def submit_tool_call(server: ToolServer, tool: str, node: str, *, ttl_ms: int | None = 60_000,
                     **args: object) -> Operation:
    """Submit `tool` for call node `node` with keyword `args` as its arguments."""
    return operation_submit(server_name=server.name, tool_name=tool, call_node_id=node,
                            arguments=dict(args), ttl_ms=ttl_ms)
