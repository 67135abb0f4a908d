"""Start the Shape B reference server (tests/peers/mcp_ext_server.py) from its own venv.

Importable without Django: only the standard library and httpx.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.peers.ext_venv import ext_venv_python
from tests.peers.launch import REPO_ROOT, _base_url, _free_port, _read, _stop

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
    with tempfile.TemporaryDirectory(prefix="mcp-ext-peer-") as tmp:
        log_path = Path(tmp) / "stderr.log"
        last_error = ""
        for _attempt in range(3):
            port = _free_port()
            cmd = [str(python), str(SERVER_SCRIPT), "--host", "127.0.0.1", "--port", str(port),
                   "--poll-interval-ms", str(poll_interval_ms)]
            if execution_ttl_ms is not None:
                cmd += ["--execution-ttl-ms", str(execution_ttl_ms)]
            if not tasks:
                cmd.append("--no-tasks")
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
            url = f"http://127.0.0.1:{port}/mcp"
            try:
                if _wait_ready(proc, url):
                    yield url
                    return
                last_error = _read(log_path)
                if "address already in use" not in last_error.lower():
                    break
            finally:
                _stop(proc)
        raise RuntimeError(f"ext MCP server did not start: {cmd}\n--- output ---\n{last_error}")


def _wait_ready(proc: subprocess.Popen[bytes], url: str) -> bool:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            ext_peer_stats(url)
            return True
        except httpx.HTTPError:
            time.sleep(0.1)
    return False
