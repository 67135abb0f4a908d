"""Adapters per tool server, cached per process so HTTP connections are pooled.

The cache key includes the session id: when a session is replaced, the old adapter is not reused.
"""

from __future__ import annotations

import threading

from django.conf import settings

from adapters import TaskAdapter, adapter_for
from ledger.models import ToolServer

_lock = threading.Lock()
_cache: dict[tuple[int, str, str, str], TaskAdapter] = {}


def adapter_for_server(*, server: ToolServer) -> TaskAdapter:
    key = (server.pk, server.adapter_version, server.url, server.session_id)
    with _lock:
        adapter = _cache.get(key)
        if adapter is None:
            adapter = adapter_for(
                version=server.adapter_version,
                url=server.url,
                session_id=server.session_id or None,
                timeout_s=float(settings.TOOLOPS_HTTP_TIMEOUT_SECONDS),
                # Adapter settings negotiation stored (AIP-151: the configured methods).
                options=(server.capabilities or {}).get("adapter_options"),
            )
            _cache[key] = adapter
        return adapter


def adapters_close_all() -> None:
    with _lock:
        for adapter in _cache.values():
            adapter.close()
        _cache.clear()
