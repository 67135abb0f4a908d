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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run each file's tests together, so the progress output names each file once.

    pytest-django sorts the whole session into rollback tests, then transactional tests, then
    tests without a database, which splits every file that holds more than one kind. Grouping by
    file (files in the order of their first test; inside a file, pytest-django's order, since the
    sort is stable) is safe here: a transactional test ends by flushing every table and the flush
    runs post_migrate again (no test sets `available_apps`), so what a later test may rely on
    (content types, permissions) is back, and no test relies on rows a migration inserts.
    """
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        first.setdefault(item.nodeid.split("::", 1)[0], index)
    items.sort(key=lambda item: first[item.nodeid.split("::", 1)[0]])


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
    admission = sys.modules.get("toolops.services.admission")
    if admission is not None:  # remembered admissions name rows of this test's database
        admission.admissions_forget_all()
