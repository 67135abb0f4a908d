"""Adapter selection by the `adapter_version` stored on a ledger row.

The version on the row, not the server URL, picks the code: two shapes may share a URL
and similar fields while meaning different things (docs/protocols.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from adapters import limits
from adapters.aip151 import Aip151Adapter
from adapters.base import TaskAdapter
from adapters.mcp_tasks_2025 import McpTasks2025Adapter
from adapters.mcp_tasks_ext_2026 import McpTasksExt2026Adapter


@dataclass(frozen=True)
class Bounds:
    """Per-request wall-clock deadline and response size cap (docs/adapter-boundary.md)."""

    request_deadline_s: float = limits.DEFAULT_REQUEST_DEADLINE_S
    max_response_bytes: int = limits.DEFAULT_MAX_RESPONSE_BYTES


# (url, session id, timeout, transport, options, bounds): options are adapter-specific settings
# kept with the server (AIP-151: the tools' configured methods and the operations prefix).
_Factory = Callable[
    [str, str | None, float, httpx.BaseTransport | None, dict[str, Any] | None, Bounds], TaskAdapter
]


def _mcp_tasks_2025(
    url: str, session_id: str | None, timeout_s: float, transport: httpx.BaseTransport | None,
    options: dict[str, Any] | None, bounds: Bounds,
) -> TaskAdapter:
    return McpTasks2025Adapter(url=url, session_id=session_id, timeout_s=timeout_s, transport=transport,
                               request_deadline_s=bounds.request_deadline_s,
                               max_response_bytes=bounds.max_response_bytes)


def _mcp_tasks_ext_2026(
    url: str, session_id: str | None, timeout_s: float, transport: httpx.BaseTransport | None,
    options: dict[str, Any] | None, bounds: Bounds,
) -> TaskAdapter:
    return McpTasksExt2026Adapter(url=url, timeout_s=timeout_s, transport=transport,
                                  request_deadline_s=bounds.request_deadline_s,
                                  max_response_bytes=bounds.max_response_bytes)


def _aip_151(
    url: str, session_id: str | None, timeout_s: float, transport: httpx.BaseTransport | None,
    options: dict[str, Any] | None, bounds: Bounds,
) -> TaskAdapter:
    return Aip151Adapter(url=url, options=options, timeout_s=timeout_s, transport=transport,
                         request_deadline_s=bounds.request_deadline_s,
                         max_response_bytes=bounds.max_response_bytes)


_FACTORIES: dict[str, _Factory] = {
    McpTasks2025Adapter.version: _mcp_tasks_2025,
    McpTasksExt2026Adapter.version: _mcp_tasks_ext_2026,
    Aip151Adapter.version: _aip_151,
}

ADAPTER_VERSIONS: tuple[str, ...] = tuple(_FACTORIES)


def adapter_for(
    *,
    version: str,
    url: str,
    session_id: str | None,
    timeout_s: float = 30.0,
    transport: httpx.BaseTransport | None = None,
    options: dict[str, Any] | None = None,
    bounds: Bounds | None = None,
) -> TaskAdapter:
    """A new adapter for `version`; ValueError names the known versions when it is unknown."""
    factory = _FACTORIES.get(version)
    if factory is None:
        known = ", ".join(ADAPTER_VERSIONS)
        raise ValueError(f"unknown adapter version {version!r}; known versions: {known}")
    return factory(url, session_id, timeout_s, transport, options, bounds or Bounds())


__all__ = ["ADAPTER_VERSIONS", "Bounds", "adapter_for"]
