"""A reply of the executor's HTTP/1.1 transport (adapters/http11.py): `http.client`'s framing,
with the header block read here.

`http.client` parses a reply's header block with the `email` package, which cost more CPU than
the rest of reading a short JSON reply. An HTTP header block needs only each line split at its
first colon, a folded continuation line joined to the value before it, and repeated names kept
in order (docs/adapter-boundary.md, "The executor's HTTP/1.1 transport").
"""

from __future__ import annotations

import http.client
from typing import Any

# http.client's own limits on a reply's header block (its _MAXLINE and _MAXHEADERS).
MAX_HEADER_LINE = 65536
MAX_HEADERS = 100


class ReplyHeaders:
    """A reply's header block: as much of `email.message.Message` as `http.client` uses (get,
    get_all, items), plus the raw pairs httpx takes."""

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.raw = raw
        self._pairs = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in raw]

    def get(self, name: str, default: Any = None) -> Any:
        wanted = name.lower()
        for key, value in self._pairs:
            if key.lower() == wanted:
                return value
        return default

    def get_all(self, name: str, default: Any = None) -> Any:
        wanted = name.lower()
        found = [value for key, value in self._pairs if key.lower() == wanted]
        return found or default

    def items(self) -> list[tuple[str, str]]:
        return list(self._pairs)


def read_header_block(fp: Any) -> ReplyHeaders:
    """The header lines up to the blank line, within http.client's limits; a line that is not
    `name: value` (nor a continuation of one) is a malformed reply, as h11 would have it."""
    raw: list[tuple[bytes, bytes]] = []
    while True:
        line = fp.readline(MAX_HEADER_LINE + 1)
        if len(line) > MAX_HEADER_LINE:
            raise http.client.LineTooLong("header line")
        if line in (b"\r\n", b"\n", b""):
            return ReplyHeaders(raw)
        if len(raw) >= MAX_HEADERS:
            raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")
        if line[:1] in (b" ", b"\t") and raw:  # obsolete line folding: part of the last value
            name, value = raw[-1]
            raw[-1] = (name, value + b" " + line.strip())
            continue
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise http.client.HTTPException(f"malformed header line {line[:80]!r}")
        raw.append((name, value.strip()))


class Http11Reply(http.client.HTTPResponse):
    """`http.client.HTTPResponse` with the header block read by read_header_block; the framing
    decisions (chunked, length, keep-alive) are begin()'s own, in its order."""

    raw_headers: list[tuple[bytes, bytes]]  # set by begin(), read only after it

    def begin(self) -> None:
        if self.headers is not None:
            return
        while True:
            version, status, reason = self._read_status()  # type: ignore[attr-defined]
            if status != http.client.CONTINUE:
                break
            read_header_block(self.fp)  # an interim 100 reply's headers: skipped
        self.code = self.status = status
        self.reason = reason.strip()
        if version in ("HTTP/1.0", "HTTP/0.9"):
            self.version = 10
        elif version.startswith("HTTP/1."):
            self.version = 11
        else:
            raise http.client.UnknownProtocol(version)
        headers = read_header_block(self.fp)
        self.headers = self.msg = headers  # type: ignore[assignment]
        self.raw_headers = headers.raw
        encoding = headers.get("transfer-encoding")
        self.chunked = bool(encoding and encoding.lower() == "chunked")
        if self.chunked:
            self.chunk_left = None
        self.will_close = self._check_close()  # type: ignore[attr-defined]
        self.length = None
        length = headers.get("content-length")
        if length and not self.chunked:
            try:
                self.length = int(length)
            except ValueError:
                self.length = None
            else:
                if self.length < 0:  # a negative length is ignored, as http.client does
                    self.length = None
        if (status in (http.client.NO_CONTENT, http.client.NOT_MODIFIED)
                or 100 <= status < 200 or self._method == "HEAD"):  # type: ignore[attr-defined]
            self.length = 0
        if not self.will_close and not self.chunked and self.length is None:
            self.will_close = True


__all__ = ["MAX_HEADERS", "MAX_HEADER_LINE", "Http11Reply", "ReplyHeaders", "read_header_block"]
