"""Adapter selection by the `adapter_version` stored on a ledger row.

The version on the row, not the server URL, picks the code: two shapes may share a URL
and similar fields while meaning different things (design.md section 6).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from adapters.base import TaskAdapter
from adapters.mcp_tasks_2025 import McpTasks2025Adapter
from adapters.mcp_tasks_ext_2026 import McpTasksExt2026Adapter

_Factory = Callable[[str, str | None, float, httpx.BaseTransport | None], TaskAdapter]


def _mcp_tasks_2025(
    url: str, session_id: str | None, timeout_s: float, transport: httpx.BaseTransport | None
) -> TaskAdapter:
    return McpTasks2025Adapter(url=url, session_id=session_id, timeout_s=timeout_s, transport=transport)


def _mcp_tasks_ext_2026(
    url: str, session_id: str | None, timeout_s: float, transport: httpx.BaseTransport | None
) -> TaskAdapter:
    return McpTasksExt2026Adapter(url=url, timeout_s=timeout_s, transport=transport)


_FACTORIES: dict[str, _Factory] = {
    McpTasks2025Adapter.version: _mcp_tasks_2025,
    McpTasksExt2026Adapter.version: _mcp_tasks_ext_2026,
}

ADAPTER_VERSIONS: tuple[str, ...] = tuple(_FACTORIES)


def adapter_for(
    *,
    version: str,
    url: str,
    session_id: str | None,
    timeout_s: float = 30.0,
    transport: httpx.BaseTransport | None = None,
) -> TaskAdapter:
    """A new adapter for `version`; ValueError names the known versions when it is unknown."""
    factory = _FACTORIES.get(version)
    if factory is None:
        known = ", ".join(ADAPTER_VERSIONS)
        raise ValueError(f"unknown adapter version {version!r}; known versions: {known}")
    return factory(url, session_id, timeout_s, transport)


__all__ = ["ADAPTER_VERSIONS", "adapter_for"]
