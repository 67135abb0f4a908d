"""Which protocol shape a server speaks, and whether it offers tasks at all.

`--adapter auto` tries, in order (docs/protocols.md):
1. the tasks extension on 2026-07-28 (`server/discover` listing io.modelcontextprotocol/tasks);
2. MCP 2025-11-25 core tasks (`initialize` with tasks.requests.tools.call);
3. synchronous calls only, within each tool's published bound (`--sync-bounds`), using the
   newest shape that answered;
4. otherwise refuse: a call that may outlive any timeout is never made blindly.
AIP-151 is never auto-detected: it is plain HTTP/JSON with configured methods, and similar
URLs must never be taken for one protocol.
"""

from __future__ import annotations

from typing import Any

from adapters import AdapterError, adapter_for
from adapters.base import Negotiated, RequestGate, ToolDescriptor
from adapters.mcp_tasks_ext_2026 import EXTENSION
from ledger.models import ToolServer
from toolops.errors import ToolopsError
from toolops.services.connections import settings_bounds
from toolops.services.server_transport import server_transport

EXT = "mcp-tasks-ext/2026-07-28"
CORE_2025 = "mcp-tasks/2025-11-25"
AIP = "aip-151/v1"
AUTO_ORDER = (EXT, CORE_2025)


def negotiate_with(
    *, url: str, adapter_version: str, options: dict[str, Any] | None = None,
    request_gate: RequestGate | None = None, credentials: dict[str, Any] | None = None,
) -> tuple[Negotiated, list[ToolDescriptor]]:
    """`request_gate`: for a server already in use (a re-initialisation), its QPS gate.
    `credentials`: what registration split off the URL (sent, never stored in the URL)."""
    transport = server_transport(credentials=credentials)
    try:
        adapter = adapter_for(version=adapter_version, url=url, session_id=None, options=options,
                              bounds=settings_bounds(), transport=transport)
    except ValueError as exc:
        transport.close()
        raise ToolopsError(str(exc)) from exc
    adapter.set_request_gate(request_gate)
    try:
        negotiated = adapter.negotiate()
        tools = adapter.list_tools()
    except AdapterError as exc:
        raise ToolopsError(f"negotiation with {url} ({adapter_version}) failed: {exc}") from exc
    finally:
        # Closing the HTTP client only; an MCP session stays open on the server for the workers.
        adapter.close()
        transport.close()
    return negotiated, tools


def negotiate_auto(
    *, url: str, sync_bounds: dict[str, float], request_gate: RequestGate | None = None,
    credentials: dict[str, Any] | None = None,
) -> tuple[str, Negotiated, list[ToolDescriptor], list[str]]:
    """(chosen version, negotiated, tools, notes on what was tried); every shape tried passes
    `request_gate` (the server's cap) for each of its requests."""
    notes: list[str] = []
    sync_capable: tuple[str, Negotiated, list[ToolDescriptor]] | None = None
    for version in AUTO_ORDER:
        try:
            negotiated, tools = negotiate_with(url=url, adapter_version=version,
                                               request_gate=request_gate, credentials=credentials)
        except ToolopsError as exc:
            notes.append(f"{version}: {exc}")
            continue
        if negotiated.supports_task_tools_call:
            notes.append(f"{version}: tasks offered")
            return version, negotiated, tools, notes
        notes.append(f"{version}: answered, but offers no tasks")
        sync_capable = sync_capable or (version, negotiated, tools)
    if sync_capable is not None:
        version, negotiated, tools = sync_capable
        bounded = sorted(set(sync_bounds) & {t.name for t in tools})
        if bounded:
            notes.append(f"{version}: synchronous only, for {', '.join(bounded)}")
            return version, negotiated, tools, notes
    raise ToolopsError(
        f"server {url} offers no task support in any known shape and no tool has a published "
        "synchronous bound; refusing (" + "; ".join(notes) + ")"
    )


def server_offers_tasks(*, server: ToolServer) -> bool:
    """Whether task mode is possible on this server, read from what negotiation stored."""
    caps = server.capabilities or {}
    if server.adapter_version == EXT:
        return EXTENSION in (caps.get("extensions") or {})
    if server.adapter_version == AIP:
        return True  # every configured LRO method answers with an operation
    requests = ((caps.get("tasks") or {}).get("requests") or {}).get("tools") or {}
    return requests.get("call") is not None
