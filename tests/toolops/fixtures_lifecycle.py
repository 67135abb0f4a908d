"""Fixtures and helpers shared by the lifecycle matrices (test_lifecycle_matrix*.py).

A pytest plugin (registered in tests/conftest.py), not a conftest: a server row per shape on the
session's peer; the submit / settle helpers are imported by name from the matrices.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ledger.models import Operation, ToolServer
from tests.peers.launch_aip import AIP_OPTIONS, aip_reset
from tests.toolops.helpers import submit_tool_call
from toolops.runner import run_embedded
from toolops.services.servers import server_add

EXT_VERSION = "mcp-tasks-ext/2026-07-28"
AIP_VERSION = "aip-151/v1"
# Long enough for the slowest case (a 5 s task cancelled, or a 2 s wait for expiry) on a
# 2-core machine shared with other test runs; run_embedded returns as soon as it is idle.
SETTLE_MAX_S = 30


@pytest.fixture
def ext_server(ext_url: str) -> ToolServer:
    return server_add(name="ext", url=ext_url, adapter_version=EXT_VERSION)


@pytest.fixture
def aip_server(aip_url: str) -> Iterator[ToolServer]:
    aip_reset(aip_url)
    yield server_add(name="aip", url=aip_url, adapter_version=AIP_VERSION, options=AIP_OPTIONS)
    aip_reset(aip_url)


def lifecycle_submit(server: ToolServer, tool: str, node: str, **args: object) -> Operation:
    return submit_tool_call(server, tool, node, ttl_ms=None, **args)


def lifecycle_settle() -> None:
    run_embedded(until_idle=True, max_seconds=SETTLE_MAX_S)
