"""The bounded field decoders and the whole-message JSON check (adapters/decode.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from adapters import ProtocolViolationError, decode, limits
from adapters.base import FetchedResult, ServerRequest, ToolDescriptor


@pytest.fixture(autouse=True)
def _fresh_adapters() -> Iterator[None]:
    """Overrides the repo-wide fixture of this name: these tests need no Django."""
    yield


def _violation(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ProtocolViolationError) as info:
        fn(*args, **kwargs)
    assert info.value.detail["violation"]
    return str(info.value)


def test_deep_json_is_a_violation_not_a_recursion_error() -> None:
    for depth in (limits.JSON_MAX_DEPTH + 1, 5_000, 100_000):
        text = "[" * depth + "1" + "]" * depth
        assert "nested too deep" in _violation(decode.json_loads, text, what="reply")
    ok = "[" * (limits.JSON_MAX_DEPTH - 1) + "1" + "]" * (limits.JSON_MAX_DEPTH - 1)
    decode.json_loads(ok, what="reply")


@pytest.mark.parametrize("text", ['{"a": "x\\u0000y"}', '{"x\\u0000": 1}', '["\\ud800"]',
                                  '{"a": ["\\udc00 tail"]}'])
def test_nul_and_lone_surrogates_anywhere_are_violations(text: str) -> None:
    assert "NUL or a lone surrogate" in _violation(decode.json_loads, text, what="reply")


def test_a_surrogate_pair_is_a_character_not_a_violation() -> None:
    assert decode.json_loads('"\\ud83d\\ude00"', what="reply") == "\U0001f600"


def test_numbers_outside_the_canonical_range() -> None:
    assert "double range" in _violation(decode.json_loads, "[1e400]", what="reply")
    assert "malformed JSON" in _violation(decode.json_loads, "[NaN]", what="reply")
    big = str(10**30)
    assert decode.json_loads(big, what="reply") == 10**30  # envelope: left to the field decoders
    assert "canonical-JSON range" in _violation(decode.json_loads, big, what="reply", strict_numbers=True)
    decode.json_loads(str(limits.JSON_MAX_SAFE_INTEGER), what="reply", strict_numbers=True)


def test_results_descriptors_and_input_params_are_checked_strictly_on_construction() -> None:
    with pytest.raises(ProtocolViolationError, match="canonical-JSON range"):
        FetchedResult(kind="result", payload={"n": 10**30}, is_error=False, raw={})
    with pytest.raises(ProtocolViolationError, match="NUL"):
        ToolDescriptor(name="t", task_support="optional", raw={"description": "a\x00b"})
    with pytest.raises(ProtocolViolationError, match="canonical-JSON range"):
        ServerRequest(request_id=1, method="elicitation/create", params={"n": -(10**20)},
                      related_task_id=None)


def test_task_ids_fit_the_ledger_column() -> None:
    assert decode.task_id("t" * limits.REMOTE_ID_MAX_CHARS) == "t" * limits.REMOTE_ID_MAX_CHARS
    assert "longer than 300" in _violation(decode.task_id, "t" * 1000)
    assert "is empty" in _violation(decode.task_id, "  ")
    assert "not a string" in _violation(decode.task_id, 42)
    assert "NUL" in _violation(decode.task_id, "a\x00")


def test_input_request_ids() -> None:
    assert decode.server_request_id(7) == 7
    assert decode.server_request_id("k") == "k"
    _violation(decode.server_request_id, "k" * (limits.SERVER_REQUEST_ID_MAX_CHARS + 1))
    _violation(decode.server_request_id, 2**60)
    _violation(decode.server_request_id, None)


def test_poll_interval_negative_is_a_violation_and_huge_is_clamped() -> None:
    assert decode.poll_interval_ms(None) is None
    assert decode.poll_interval_ms(0) == 0
    assert decode.poll_interval_ms(250.7) == 250
    assert decode.poll_interval_ms(2**40) == limits.POLL_INTERVAL_MAX_MS
    assert decode.poll_interval_ms(10**30) == limits.POLL_INTERVAL_MAX_MS
    assert "negative" in _violation(decode.poll_interval_ms, -5)
    assert "negative" in _violation(decode.poll_interval_ms, -1000)
    assert "not a number" in _violation(decode.poll_interval_ms, "100")
    assert "not a number" in _violation(decode.poll_interval_ms, True)


def test_ttl_negative_is_a_violation_and_huge_is_clamped() -> None:
    assert decode.ttl_ms(60_000) == 60_000
    assert decode.ttl_ms(10**20) == limits.TTL_MAX_MS
    assert "negative" in _violation(decode.ttl_ms, -5)
    assert "not finite" in _violation(decode.ttl_ms, float("inf"))


def test_timestamps_need_a_zone_and_a_sane_year() -> None:
    assert decode.timestamp("2026-01-02T03:04:05Z") == "2026-01-02T03:04:05+00:00"
    assert decode.timestamp("2026-01-02T03:04:05.5+02:00") == "2026-01-02T03:04:05.500000+02:00"
    assert decode.timestamp(None) is None
    assert "not an ISO 8601" in _violation(decode.timestamp, "2026-13-45T00:00:00Z")
    assert "not an ISO 8601" in _violation(decode.timestamp, "yesterday")
    assert "no time zone" in _violation(decode.timestamp, "2026-01-01T00:00:00")
    assert "outside the years" in _violation(decode.timestamp, "9999-12-31T23:59:59+00:00")
    assert "not a string" in _violation(decode.timestamp, None, required=True)
    assert "longer than" in _violation(decode.timestamp, "2026-01-01T00:00:00Z" + " " * 100)


def test_status_outside_the_spec_is_a_violation() -> None:
    allowed = {"working", "completed"}
    assert decode.status("working", allowed=allowed) == "working"
    detail_text = _violation(decode.status, "paused", allowed=allowed)
    assert "outside the spec" in detail_text
    _violation(decode.status, None, allowed=allowed)


def test_status_message_is_cut_with_a_marker() -> None:
    assert decode.status_message(None) is None
    assert decode.status_message("fine") == "fine"
    cut = decode.status_message("m" * 100_000)
    assert cut is not None and len(cut) == limits.STATUS_MESSAGE_MAX_CHARS
    assert cut.endswith(limits.TRUNCATION_MARKER.format(dropped=100_000 - limits.STATUS_MESSAGE_MAX_CHARS))
    assert "NUL" in _violation(decode.status_message, "a\x00b")
    _violation(decode.status_message, 12)


def test_quotes_in_error_details_are_short_and_storable() -> None:
    quoted = decode.quote("x\x00\ud800" + "y" * 500)
    assert len(quoted) == limits.DETAIL_QUOTE_CHARS and "\x00" not in quoted
    quoted.encode("utf-8")  # no lone surrogate left
    with pytest.raises(ProtocolViolationError) as info:
        decode.expect_same_task(asked="t-1", got="t\x00" * 300)
    assert len(info.value.detail["got"]) <= limits.DETAIL_QUOTE_CHARS


def test_tool_names_fit_the_ledger_column() -> None:
    ToolDescriptor(name="t" * limits.TOOL_NAME_MAX_CHARS, task_support="optional", raw={})
    with pytest.raises(ProtocolViolationError, match="tool name longer than"):
        ToolDescriptor(name="t" * (limits.TOOL_NAME_MAX_CHARS + 1), task_support="optional", raw={})


def test_a_literal_surrogate_in_text_input_is_caught_too() -> None:
    assert "lone surrogate" in _violation(decode.json_loads, '["a\ud800"]', what="sse event")
    assert decode.json_loads('["caf\u00e9"]', what="sse event") == ["caf\u00e9"]
    # json.loads decodes bytes with surrogatepass: UTF-8-encoded surrogate bytes are caught as well
    assert "lone surrogate" in _violation(decode.json_loads, b'["a\xed\xa0\x80"]', what="body")
