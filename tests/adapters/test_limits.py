"""The documented bounds agree with the ledger columns the decoded values are stored in."""

from __future__ import annotations

from adapters import limits
from ledger.models import InputRequest, Operation


def test_id_bounds_match_the_ledger_columns() -> None:
    assert Operation._meta.get_field("remote_id").max_length == limits.REMOTE_ID_MAX_CHARS
    assert InputRequest._meta.get_field("server_request_id").max_length == limits.SERVER_REQUEST_ID_MAX_CHARS
    assert Operation._meta.get_field("server_state").max_length == limits.STATUS_MAX_CHARS


def test_clamped_values_fit_their_columns() -> None:
    assert limits.POLL_INTERVAL_MAX_MS <= 2**31 - 1  # PositiveIntegerField on PostgreSQL
    assert limits.TTL_MAX_MS <= 2**63 - 1  # PositiveBigIntegerField


def test_name_bounds_match_the_ledger_columns() -> None:
    from ledger.models import ToolServer

    assert Operation._meta.get_field("tool_name").max_length == limits.TOOL_NAME_MAX_CHARS
    assert ToolServer._meta.get_field("session_id").max_length == limits.SESSION_ID_MAX_CHARS
