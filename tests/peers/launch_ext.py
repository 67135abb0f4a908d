"""Start the Shape B reference server (tests/peers/mcp_ext_server.py) from its own venv.

Importable without Django: only the standard library and httpx.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from tests.peers.ext_venv import ext_venv_python
from tests.peers.launch import REPO_ROOT, _base_url, running_peer

# FastMCP imports a lot on first start (cold bytecode cache in a fresh venv).
STARTUP_TIMEOUT_S = 60.0
SERVER_SCRIPT = REPO_ROOT / "tests" / "peers" / "mcp_ext_server.py"


def ext_peer_stats(mcp_url: str) -> dict[str, Any]:
    """{"runs": {tool: tool-body runs}}; a body runs once per input leg."""
    response = httpx.get(f"{_base_url(mcp_url)}/_peer/stats", timeout=5.0)
    response.raise_for_status()
    return dict(response.json())


@contextmanager
def running_ext_server(
    *, poll_interval_ms: int = 100, execution_ttl_ms: int | None = None, tasks: bool = True
) -> Iterator[str]:
    """Run the FastMCP + fastmcp-tasks peer on a free port; yield its MCP URL."""
    python = ext_venv_python()

    def command(port: int) -> list[str]:
        cmd = [str(python), str(SERVER_SCRIPT), "--host", "127.0.0.1", "--port", str(port),
               "--poll-interval-ms", str(poll_interval_ms)]
        if execution_ttl_ms is not None:
            cmd += ["--execution-ttl-ms", str(execution_ttl_ms)]
        if not tasks:
            cmd.append("--no-tasks")
        return cmd

    with running_peer(name="ext MCP server", command=command,
                      url_for=lambda port: f"http://127.0.0.1:{port}/mcp", ready=ext_peer_stats,
                      startup_timeout_s=STARTUP_TIMEOUT_S, log_stdout=True) as url:
        yield url
