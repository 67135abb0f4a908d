"""SHA-256 digests over RFC 8785 (JCS) canonical JSON, via the maintained `rfc8785` package.

`rfc8785` serializes in pure Python, and every call digests its request and its result. For the
values where the standard library's C encoder spells exactly what RFC 8785 does, it is used
instead: no floats (RFC 8785 spells numbers as ECMAScript does), integers within ±(2**53 - 1)
(beyond, RFC 8785 has them as doubles), object keys in ASCII (RFC 8785 sorts keys by UTF-16 code
unit, `sort_keys` by code point; the two orders differ only beyond U+D7FF), and no lone surrogate
(caught by the UTF-8 encode). Strings are escaped alike: `"`, the backslash, the short forms for
backspace, tab, newline, form feed and carriage return, other control characters as lowercase
`\\u00xx`, everything else as it is. Anything else goes to `rfc8785`. tests/ledger/test_digests.py
holds the two to the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import rfc8785

# The largest integer RFC 8785 spells as the integer itself (an IEEE double holds it exactly).
_SAFE_INTEGER = 2**53 - 1
# Deeper values go to rfc8785 (which has its own limit) rather than a deep recursion here.
_PLAIN_DEPTH = 64
_encode = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"),
                           allow_nan=False, check_circular=False).encode


def _plain(value: Any, depth: int = 0) -> bool:
    """True when the standard library's encoder spells `value` as RFC 8785 does (module doc)."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return -_SAFE_INTEGER <= value <= _SAFE_INTEGER
    if depth >= _PLAIN_DEPTH:
        return False
    if kind is dict:
        return all(type(key) is str and key.isascii() and _plain(item, depth + 1)
                   for key, item in value.items())
    if kind is list:
        return all(_plain(item, depth + 1) for item in value)
    return False


def canonical_json(value: Any) -> bytes:
    if _plain(value):
        try:
            return _encode(value).encode("utf-8")
        except UnicodeEncodeError:
            pass  # a lone surrogate: rfc8785 decides what it is
    return rfc8785.dumps(value)


def canonical_digest(value: Any) -> str:
    """`sha256:<hex>` of the canonical JSON form; stable across key order and number spelling."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def request_digest(*, tool_name: str, arguments: dict[str, Any], descriptor_version: str) -> str:
    return canonical_digest(
        {"tool": tool_name, "arguments": arguments, "descriptor_version": descriptor_version}
    )
