"""Start the reference MCP server (`python -m toolops.reference_server`) as a subprocess.

Importable without Django and without the server's own dependencies: only the standard library
and httpx. `running_peer` is generic (the tests run their other peers with it too).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

# The directory holding the `toolops` package (the repository root in a checkout, site-packages
# when installed): peers started with `-m` run there so their module resolves.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 20.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _base_url(mcp_url: str) -> str:
    """http://127.0.0.1:PORT/mcp -> http://127.0.0.1:PORT"""
    url = httpx.URL(mcp_url)
    return str(url.copy_with(path="/", query=None, fragment=None)).rstrip("/")


def peer_stats(mcp_url: str) -> dict[str, Any]:
    """Server-side counters: {"tasks_created", "tool_calls", "submission_keys", ...}."""
    response = httpx.get(f"{_base_url(mcp_url)}/_peer/stats", timeout=5.0)
    response.raise_for_status()
    return dict(response.json())


def peer_reset(mcp_url: str) -> None:
    """Zero the server-side counters (tasks and sessions are kept)."""
    httpx.post(f"{_base_url(mcp_url)}/_peer/reset", timeout=5.0).raise_for_status()


def peer_lookup(mcp_url: str, key: str, session_id: str | None = None) -> str | None:
    """Cooperating servers only: the taskId created for a submission key, or None."""
    params = {"key": key} | ({"session": session_id} if session_id else {})
    response = httpx.get(f"{_base_url(mcp_url)}/_peer/lookup", params=params, timeout=5.0)
    if response.status_code == 404:
        return None
    response.raise_for_status()
    return str(response.json()["taskId"])


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


@contextmanager
def running_peer(
    *, name: str, command: Callable[[int], list[str]], url_for: Callable[[int], str],
    ready: Callable[[str], object], startup_timeout_s: float = STARTUP_TIMEOUT_S,
    log_stdout: bool = False, cwd: Path = PACKAGE_ROOT,
) -> Iterator[str]:
    """Run one peer process on a free port; yield its URL once `ready(url)` answers.

    Output goes to a file, not a pipe: a pipe nobody drains would eventually block the server.
    The free port can be taken between probe and bind, so a bind failure is retried.
    """
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        log_path = Path(tmp) / "output.log"
        last_error = ""
        cmd: list[str] = []
        for _attempt in range(3):
            port = _free_port()
            cmd = command(port)
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    cmd, cwd=cwd, stderr=log if not log_stdout else subprocess.STDOUT,
                    stdout=log if log_stdout else subprocess.DEVNULL,
                )
            url = url_for(port)
            try:
                if _wait_ready(proc, url, ready=ready, timeout_s=startup_timeout_s):
                    yield url
                    return
                last_error = _read(log_path)
                if "address already in use" not in last_error.lower():
                    break
            finally:
                _stop(proc)
        raise RuntimeError(f"{name} did not start: {cmd}\n--- output ---\n{last_error}")


def _wait_ready(proc: subprocess.Popen[bytes], url: str, *, ready: Callable[[str], object],
                timeout_s: float) -> bool:
    """True once `ready(url)` answers; False if the process exits or the timeout passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            ready(url)
            return True
        except httpx.HTTPError:
            time.sleep(0.05)
    return False


@contextmanager
def running_reference_server(
    *, cooperating: bool | str = False, poll_interval_ms: int | None = None
) -> Iterator[str]:
    """Run the reference server on a free port; yield its MCP URL (http://127.0.0.1:PORT/mcp)."""

    def command(port: int) -> list[str]:
        cmd = [sys.executable, "-m", "toolops.reference_server", "--host", "127.0.0.1", "--port", str(port)]
        if cooperating:
            cmd += ["--cooperating", cooperating if isinstance(cooperating, str) else "full"]
        if poll_interval_ms is not None:
            cmd += ["--poll-interval-ms", str(poll_interval_ms)]
        return cmd

    with running_peer(name="reference MCP server", command=command,
                      url_for=lambda port: f"http://127.0.0.1:{port}/mcp", ready=peer_stats) as url:
        yield url
