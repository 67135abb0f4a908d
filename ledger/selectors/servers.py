"""Reads of registered tool servers."""

from __future__ import annotations

from ledger.models import ToolServer


def server_get(*, name: str) -> ToolServer:
    return ToolServer.objects.get(name=name)
