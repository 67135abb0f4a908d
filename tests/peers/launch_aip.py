"""Start the AIP-151 fake (tests/peers/aip151_server.py) as a subprocess; helpers for its controls.

Importable without Django: only the standard library and httpx.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from tests.peers.launch import REPO_ROOT, running_peer

STARTUP_TIMEOUT_S = 20.0
# The fake's tool method and operations prefix, as a server-add would configure them.
AIP_OPTIONS: dict[str, Any] = {
    "operations_prefix": "v1",
    "list_path": "v1/projects/p/locations/l/operations",
    "methods": {"render": {"http_method": "POST", "path": "v1/projects/p/locations/l/jobs:run"}},
}


def aip_stats(base_url: str) -> dict[str, Any]:
    response = httpx.get(f"{base_url}/_fake/stats", timeout=5.0)
    response.raise_for_status()
    return dict(response.json())


def aip_faults(base_url: str, **controls: Any) -> None:
    """e.g. faults=[{"status": 503, "count": 2, "retryAfter": "1", "match": "get"}],
    dropAfterCommit=1, unimplemented=["cancel"]."""
    httpx.post(f"{base_url}/_fake/faults", json=controls, timeout=5.0).raise_for_status()


def aip_reset(base_url: str) -> None:
    httpx.post(f"{base_url}/_fake/reset", timeout=5.0).raise_for_status()


@contextmanager
def running_aip_server() -> Iterator[str]:
    """Run the fake on a free port; yield its base URL (http://127.0.0.1:PORT)."""
    with running_peer(
        name="AIP-151 fake",
        command=lambda port: [sys.executable, "-m", "tests.peers.aip151_server", "--host",
                              "127.0.0.1", "--port", str(port)],
        url_for=lambda port: f"http://127.0.0.1:{port}", ready=aip_stats,
        startup_timeout_s=STARTUP_TIMEOUT_S, cwd=REPO_ROOT,
    ) as url:
        yield url
