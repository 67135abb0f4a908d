"""Start the hostile MCP server (tests/peers/hostile_server.py) as a subprocess.

Importable without Django: only the standard library and httpx.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from tests.peers.launch import _base_url, running_peer


def hostile_stats(mcp_url: str) -> dict[str, Any]:
    response = httpx.get(f"{_base_url(mcp_url)}/_hostile/stats", timeout=5.0)
    response.raise_for_status()
    return dict(response.json())


@contextmanager
def running_hostile_server(*, trickle_s: float = 1.0) -> Iterator[str]:
    """Run the hostile server on a free port; yield its MCP URL (http://127.0.0.1:PORT/mcp)."""
    with running_peer(
        name="hostile MCP server",
        command=lambda port: [sys.executable, "-m", "tests.peers.hostile_server", "--host", "127.0.0.1",
                              "--port", str(port), "--trickle-s", str(trickle_s)],
        url_for=lambda port: f"http://127.0.0.1:{port}/mcp", ready=hostile_stats,
    ) as url:
        yield url
