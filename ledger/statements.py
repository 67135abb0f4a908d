"""Statement text spelled once per shape and replayed.

The ledger's hot writes and reads (inserts, guarded transitions, event appends, the row read, the
dispatcher's claim) run as raw statements whose text depends only on a small shape: the
connection alias and which optional parts the statement has. Quoting some forty column names or
running the ORM's compiler on every call cost more than the round trip's own Python, so each
shape's text is spelled on first use and kept for the life of the process.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")

# (site, shape) -> what the site spelled. Whole values are stored: two threads spelling one shape
# at once store equal values, and no reader sees a half-built one (a dict store is atomic).
_SPELLED: dict[tuple[str, Hashable], Any] = {}


def statement_spelled(*, site: str, shape: Hashable, spell: Callable[[], T]) -> T:
    """What `spell()` returns for `shape` at `site`, computed the first time only.

    `site` names the caller (its statements never mix with another's); `shape` must hold
    everything the text depends on, the connection alias included.
    """
    key = (site, shape)
    found = _SPELLED.get(key)
    if found is None:
        found = _SPELLED[key] = spell()
    return found  # type: ignore[no-any-return]
