"""The reference server's launcher lives in product code (toolops/reference_server/launch.py).

Re-exported here so the tests keep one import path for every peer launcher.
"""

from __future__ import annotations

from pathlib import Path

from toolops.reference_server.launch import (
    STARTUP_TIMEOUT_S,
    _base_url,
    _free_port,
    _stop,
    peer_lookup,
    peer_reset,
    peer_stats,
    running_peer,
    running_reference_server,
)

# The repository root: the Shape B and AIP-151 peers (tests/peers/*) are started from here.
REPO_ROOT = Path(__file__).resolve().parents[2]

__all__ = [
    "REPO_ROOT",
    "STARTUP_TIMEOUT_S",
    "_base_url",
    "_free_port",
    "_stop",
    "peer_lookup",
    "peer_reset",
    "peer_stats",
    "running_peer",
    "running_reference_server",
]
