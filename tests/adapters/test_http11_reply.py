"""The header block reader of the HTTP/1.1 transport, on bytes (the transport's own tests in
test_http11.py send the same blocks over real sockets)."""

from __future__ import annotations

import http.client
import io
from collections.abc import Iterator

import pytest

from adapters.http11_reply import MAX_HEADERS, read_header_block


@pytest.fixture(autouse=True)
def _fresh_adapters() -> Iterator[None]:
    """Overrides the repo-wide fixture of this name: these tests need no Django."""
    yield


def _block(raw: bytes) -> io.BufferedReader:
    return io.BufferedReader(io.BytesIO(raw))


def test_names_are_matched_in_any_case_and_repeats_kept_in_order() -> None:
    reader = _block(b"Content-Type: application/json\r\nX-Twice: one\r\nx-twice: two\r\n\r\nbody")
    headers = read_header_block(reader)
    assert headers.get("content-type") == "application/json"
    assert headers.get("X-TWICE") == "one"  # the first, as email.message.Message.get gives it
    assert headers.get_all("x-twice") == ["one", "two"]
    assert headers.get("absent", "default") == "default" and headers.get_all("absent") is None
    assert headers.raw == [(b"Content-Type", b"application/json"), (b"X-Twice", b"one"),
                           (b"x-twice", b"two")]
    assert reader.read() == b"body"  # the block ends at the blank line, nothing more is read


def test_a_folded_line_joins_the_value_before_it_and_values_are_trimmed() -> None:
    headers = read_header_block(_block(b"X-Folded:   first \r\n\t second\r\n  third\r\n\r\n"))
    assert headers.items() == [("X-Folded", "first second third")]


def test_a_bare_lf_ends_lines_and_an_empty_block_is_no_headers() -> None:
    assert read_header_block(_block(b"A: 1\nB: 2\n\n")).items() == [("A", "1"), ("B", "2")]
    assert read_header_block(_block(b"\r\n")).items() == []
    assert read_header_block(_block(b"")).items() == []  # EOF: what http.client accepts too


@pytest.mark.parametrize("raw", [
    b"no colon here\r\n\r\n",
    b": no name\r\n\r\n",
    b"X-Bad : space before the colon\r\n\r\n",
    b" folded before any header\r\n\r\n",
    b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADERS + 1)) + b"\r\n",
    b"X-Long: " + b"a" * 70000 + b"\r\n\r\n",
])
def test_a_malformed_block_is_refused(raw: bytes) -> None:
    with pytest.raises(http.client.HTTPException):
        read_header_block(_block(raw))
