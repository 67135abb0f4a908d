"""Total decoding of server answers: a bounded, typed value or a named ProtocolViolationError.

Every JSON body any adapter reads goes through `json_loads`, which rejects, for the whole
message, what would otherwise crash later code or the database: nesting deeper than
JSON_MAX_DEPTH (recursive parsers and encoders), NUL and lone surrogates in any string or key
(PostgreSQL text and jsonb refuse both) and non-finite numbers. Values the executor digests
as canonical JSON (results, tool descriptors, input request parameters) are checked again with
`strict_numbers`: an integer outside the RFC 8785 safe range there is a violation (the
dataclasses in adapters.base do it on construction). Elsewhere a huge integer is left to the
field decoders, which bound each field the executor stores (a ttl of 10**20 is clamped).
Error details never quote more than a short, neutralised excerpt of what the server sent:
the detail is written to the ledger too.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from adapters import limits
from adapters.errors import ProtocolViolationError

_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")
_RAW_SURROGATE = re.compile(b"\xed[\xa0-\xbf]")


def quote(value: Any, *, limit: int = limits.DETAIL_QUOTE_CHARS) -> str:
    """A short excerpt of a server value that is safe to store (NUL/surrogates replaced)."""
    text = value if isinstance(value, str) else repr(value)
    return _BAD_TEXT.sub("\ufffd", text[:limit])


def _violation(reason: str, *, what: str, **detail: Any) -> ProtocolViolationError:
    return ProtocolViolationError(f"{what}: {reason}", detail={"violation": reason, "where": what, **detail})


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def json_loads(data: str | bytes, *, what: str, strict_numbers: bool = False) -> Any:
    """Parse one JSON document and check every value in it (see the module docstring)."""
    try:
        value = json.loads(data, parse_constant=_reject_constant)
    except RecursionError as exc:
        raise _violation("JSON nested too deep", what=what, max_depth=limits.JSON_MAX_DEPTH) from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, too many integer digits
        raise ProtocolViolationError(f"malformed JSON in {what}",
                                     detail={"violation": "malformed JSON", "where": what}) from exc
    # JSON can only spell NUL or a lone surrogate as a \\u escape (raw control characters are
    # refused by the parser, and strict UTF-8 cannot carry surrogates): without one, skip strings.
    # A str source may also hold a literal surrogate, which the parser passes through.
    if isinstance(data, str):
        check_text = "\\u" in data or _BAD_TEXT.search(data) is not None
    else:  # json.loads decodes bytes with surrogatepass: a raw UTF-8 surrogate gets through too
        check_text = b"\\u" in data or _RAW_SURROGATE.search(data) is not None
    json_check(value, what=what, strict_numbers=strict_numbers, check_text=check_text)
    return value


def json_check(value: Any, *, what: str, strict_numbers: bool = False, check_text: bool = True) -> None:
    """Iteratively check depth, string content (unless `check_text` is False: the caller knows
    the source text has no \\u escape, the only way JSON can spell NUL or a lone surrogate) and
    numbers: finite floats, and with `strict_numbers` integers within the canonical-JSON range."""
    bad_text = _BAD_TEXT.search if check_text else None
    max_int = limits.JSON_MAX_SAFE_INTEGER if strict_numbers else None
    max_depth = limits.JSON_MAX_DEPTH
    stack: list[tuple[Any, int]] = []

    def scalar(item: Any, kind: type) -> None:
        if kind is str:
            if bad_text is not None and bad_text(item):
                raise _violation("string holds NUL or a lone surrogate", what=what)
        elif kind is int:
            if max_int is not None and abs(item) > max_int:
                raise _violation("integer outside the canonical-JSON range", what=what,
                                 digits=len(str(abs(item))))
        elif kind is float:
            if not math.isfinite(item):
                raise _violation("number outside the double range", what=what)
        elif kind is not bool and item is not None:
            raise _violation(f"unexpected value type {kind.__name__}", what=what)

    kind = type(value)
    if kind is dict or kind is list:
        stack.append((value, 1))
    else:
        scalar(value, kind)
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            raise _violation("JSON nested too deep", what=what, max_depth=max_depth)
        children: Iterable[Any] = item
        if type(item) is dict:
            if bad_text is not None:
                for key in item:
                    if bad_text(key):
                        raise _violation("object key holds NUL or a lone surrogate", what=what)
            children = item.values()
        for child in children:
            kind = type(child)
            if kind is dict or kind is list:
                stack.append((child, depth + 1))
            elif kind is str and bad_text is None:
                continue
            else:
                scalar(child, kind)


def text(value: Any, *, field: str, max_chars: int) -> str:
    if not isinstance(value, str):
        raise _violation(f"{field} is not a string", what=field, got=type(value).__name__)
    if _BAD_TEXT.search(value):
        raise _violation(f"{field} holds NUL or a lone surrogate", what=field)
    if len(value) > max_chars:
        raise _violation(f"{field} longer than {max_chars} characters", what=field, length=len(value))
    return value


def task_id(value: Any, *, field: str = "taskId") -> str:
    """A remote id the ledger can store: a non-empty string within the column length."""
    decoded = text(value, field=field, max_chars=limits.REMOTE_ID_MAX_CHARS)
    if not decoded.strip():
        raise _violation(f"{field} is empty", what=field)
    return decoded


def server_request_id(value: Any, *, field: str = "input request id") -> str | int:
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > limits.JSON_MAX_SAFE_INTEGER:
            raise _violation(f"{field} out of range", what=field)
        return value
    return text(value, field=field, max_chars=limits.SERVER_REQUEST_ID_MAX_CHARS)


def status(value: Any, *, allowed: Iterable[str], field: str = "status") -> str:
    known = frozenset(allowed)
    if not isinstance(value, str) or value not in known:
        raise _violation(f"{field} outside the spec", what=field, got=quote(value, limit=40),
                         allowed=sorted(known))
    return value


def status_message(value: Any, *, field: str = "statusMessage") -> str | None:
    """None stays None; a string is kept, cut to STATUS_MESSAGE_MAX_CHARS with a marker."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise _violation(f"{field} is not a string", what=field, got=type(value).__name__)
    if _BAD_TEXT.search(value):
        raise _violation(f"{field} holds NUL or a lone surrogate", what=field)
    limit = limits.STATUS_MESSAGE_MAX_CHARS
    if len(value) <= limit:
        return value
    marker = limits.TRUNCATION_MARKER.format(dropped=len(value) - limit)
    return value[: limit - len(marker)] + marker if limit > len(marker) else value[:limit]


def _milliseconds(value: Any, *, field: str, maximum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _violation(f"{field} is not a number", what=field, got=type(value).__name__)
    if isinstance(value, float) and not math.isfinite(value):
        raise _violation(f"{field} is not finite", what=field)
    if value < 0:
        raise _violation(f"{field} is negative", what=field, got=quote(value, limit=40))
    return min(int(value), maximum)


def poll_interval_ms(value: Any, *, field: str = "pollInterval") -> int | None:
    """Negative: violation. Above POLL_INTERVAL_MAX_MS: clamped to it."""
    return _milliseconds(value, field=field, maximum=limits.POLL_INTERVAL_MAX_MS)


def ttl_ms(value: Any, *, field: str = "ttl") -> int | None:
    """Negative: violation. Above TTL_MAX_MS: clamped to it."""
    return _milliseconds(value, field=field, maximum=limits.TTL_MAX_MS)


def timestamp(value: Any, *, field: str = "createdAt", required: bool = False) -> str | None:
    """An ISO 8601 timestamp WITH a zone offset, returned normalised (`isoformat()`).

    Missing: None unless `required`. Unparseable, naive, or outside the year bounds: violation.
    """
    if value is None and not required:
        return None
    raw = text(value, field=field, max_chars=limits.TIMESTAMP_MAX_CHARS)
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise _violation(f"{field} is not an ISO 8601 timestamp", what=field,
                         got=quote(raw, limit=40)) from exc
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise _violation(f"{field} has no time zone", what=field, got=quote(raw, limit=40))
    if not limits.TIMESTAMP_MIN_YEAR <= parsed.year <= limits.TIMESTAMP_MAX_YEAR:
        raise _violation(f"{field} outside the years {limits.TIMESTAMP_MIN_YEAR}..."
                         f"{limits.TIMESTAMP_MAX_YEAR}", what=field, got=quote(raw, limit=40))
    return parsed.isoformat()


def expect_same_task(*, asked: str, got: str, what: str = "task") -> None:
    if asked != got:
        raise _violation(f"server answered about another {what}", what=what,
                         asked=quote(asked), got=quote(got))


def input_request_count(count: int, *, what: str) -> None:
    if count > limits.MAX_INPUT_REQUESTS:
        raise _violation(f"more than {limits.MAX_INPUT_REQUESTS} input requests", what=what,
                         count=count)


__all__ = [
    "expect_same_task",
    "input_request_count",
    "json_check",
    "json_loads",
    "poll_interval_ms",
    "quote",
    "server_request_id",
    "status",
    "status_message",
    "task_id",
    "text",
    "timestamp",
    "ttl_ms",
]
