"""Operations that break AIP-151's shape are refused as they are read, whatever the server."""

from __future__ import annotations

import pytest

from adapters.aip151_operations import remote_task
from adapters.errors import ProtocolViolationError


def test_malformed_operations_are_protocol_violations() -> None:
    with pytest.raises(ProtocolViolationError):
        remote_task({"name": "operations/x", "done": True}, expect_name=None)
    with pytest.raises(ProtocolViolationError):
        remote_task({"name": "operations/x", "done": True, "response": {}, "error": {"code": 2}},
                    expect_name=None)
    with pytest.raises(ProtocolViolationError):
        remote_task({"name": "operations/y", "done": False}, expect_name="operations/x")
