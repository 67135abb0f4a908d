"""The wire-level pieces of the JSON-RPC transport, on bytes and strings alone: SSE framing
and Retry-After. The transport's behaviour on whole HTTP exchanges is in test_jsonrpc.py."""

from __future__ import annotations

import time

from adapters.jsonrpc_frames import SseParser, parse_retry_after


def test_sse_parser_handles_split_chunks_crlf_comments_and_multiline_data() -> None:
    parser = SseParser()
    stream = b': ping - 2026\r\nevent: message\r\ndata: {"a":\r\ndata: 1}\r\n\r\nid: 7\ndata: x\n\n'
    events = []
    for i in range(len(stream)):  # worst case: one byte at a time
        events += parser.feed(stream[i : i + 1])
    assert events == [("message", '{"a":\n1}'), ("message", "x")]


def test_parse_retry_after_edge_cases() -> None:
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("1.5") == 1.5


def test_sse_parser_is_linear_in_a_long_line() -> None:
    payload = b"data: " + b"x" * (4 * 1024 * 1024) + b"\n\n"
    parser = SseParser()
    started = time.monotonic()
    events = []
    for i in range(0, len(payload), 16384):
        events += parser.feed(payload[i : i + 16384])
    assert len(events) == 1 and len(events[0][1]) == 4 * 1024 * 1024
    assert time.monotonic() - started < 2.0
