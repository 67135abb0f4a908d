"""Shared fixtures. The reference MCP server runs as a real subprocess speaking Streamable HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.peers.fault_transport import FaultTransport
from tests.peers.launch import running_reference_server
from tests.peers.launch_aip import running_aip_server
from tests.peers.launch_ext import running_ext_server
from toolops.services.connections import connections_use_transport

# ext_server / aip_server rows for the lifecycle matrices (tests/toolops/test_lifecycle_matrix*.py).
pytest_plugins = ["tests.toolops.fixtures_lifecycle"]


@pytest.fixture
def faults() -> Iterator[FaultTransport]:
    """Every adapter the executor builds talks through one scriptable fault-injecting transport."""
    transport = FaultTransport()
    connections_use_transport(lambda _server: transport)
    yield transport
    connections_use_transport(None)
    transport.close()


@pytest.fixture(scope="session")
def mcp_url() -> Iterator[str]:
    with running_reference_server(poll_interval_ms=100) as url:
        yield url


@pytest.fixture(scope="session")
def ext_url() -> Iterator[str]:
    """Shape B peer (FastMCP + fastmcp-tasks) from its own venv, built on first use."""
    with running_ext_server(poll_interval_ms=100) as url:
        yield url


@pytest.fixture(scope="session")
def aip_url() -> Iterator[str]:
    """The in-repo AIP-151 fake (tests/peers/aip151_server.py); yields its base URL."""
    with running_aip_server() as url:
        yield url


@pytest.fixture(autouse=True)
def _fresh_adapters() -> Iterator[None]:
    """Adapters are cached per process; tests must not share HTTP clients across databases."""
    yield
    import sys

    connections = sys.modules.get("toolops.services.connections")
    if connections is not None:  # only when a test used the executor (and so Django)
        connections.adapters_close_all()
