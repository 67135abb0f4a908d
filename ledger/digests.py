"""SHA-256 digests over RFC 8785 (JCS) canonical JSON, via the maintained `rfc8785` package."""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785


def canonical_json(value: Any) -> bytes:
    return rfc8785.dumps(value)


def canonical_digest(value: Any) -> str:
    """`sha256:<hex>` of the canonical JSON form; stable across key order and number spelling."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def request_digest(*, tool_name: str, arguments: dict[str, Any], descriptor_version: str) -> str:
    return canonical_digest(
        {"tool": tool_name, "arguments": arguments, "descriptor_version": descriptor_version}
    )
