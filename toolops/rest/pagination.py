"""Bounded limit/offset pages: query values reach SQL LIMIT/OFFSET, which are bigint."""

from __future__ import annotations

from typing import Any

from rest_framework.pagination import LimitOffsetPagination

# Past this an offset is meaningless (no ledger has that many rows) and would overflow bigint.
MAX_OFFSET = 2**53


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    default_limit = 50
    # Caps `?limit=`: an unbounded value would reach SQL as LIMIT (and past bigint, as a 500).
    max_limit = 500

    def get_offset(self, request: Any) -> int:
        return min(super().get_offset(request), MAX_OFFSET)
