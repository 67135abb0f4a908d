"""An operation's event series as a readable timeline: state changes stand out, poll noise folds.

A long call polled every second writes one event per unchanged poll (or, where polls are kept as
counters on the row, only a few). Runs of consecutive events of one noise kind that change
neither the local state nor the server's state fold into one entry ("42 x observed, 12:00:01 to
12:00:43"); everything else is one entry per event. The folded entries are paged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.core.paginator import Page, Paginator

from ledger.models import OperationEvent

# Kinds that repeat while nothing happens; a run of them with no state change folds into one entry.
NOISE_KINDS = frozenset({"observed", "poll_skipped", "poll_error", "poll", "polled",
                         "stale_epoch_refused", "input_required_no_new_round"})
# Event data keys that name a user by primary key; shown as the user name.
USER_ID_KEYS = ("answered_by", "user_id", "owner_id")
PAGE_SIZE = 50


@dataclass
class TimelineEntry:
    first_seq: int
    last_seq: int
    kind: str
    at: datetime
    until: datetime
    count: int
    from_state: str
    to_state: str
    server_state: str
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def state_change(self) -> bool:
        return bool(self.to_state) and self.from_state != self.to_state

    @property
    def folded(self) -> bool:
        return self.count > 1

    @property
    def data_pretty(self) -> str:
        return json.dumps(self.data, indent=2, sort_keys=True, default=str) if self.data else ""


def _foldable(entry: TimelineEntry, event: Mapping[str, Any]) -> bool:
    return (event["kind"] in NOISE_KINDS and event["kind"] == entry.kind and not entry.state_change
            and event["from_state"] == event["to_state"] == entry.to_state
            and event["server_state"] == entry.server_state)


def timeline_fold(events: Iterable[Mapping[str, Any]]) -> list[TimelineEntry]:
    """Fold runs of unchanged noise events; `events` are dicts ordered by seq."""
    entries: list[TimelineEntry] = []
    for event in events:
        last = entries[-1] if entries else None
        if last is not None and _foldable(last, event):
            last.last_seq, last.until, last.count = event["seq"], event["created_at"], last.count + 1
            # Keep the latest data of a run (e.g. its last poll error), counted as a run.
            last.data = dict(event["data"] or {})
            continue
        entries.append(TimelineEntry(
            first_seq=event["seq"], last_seq=event["seq"], kind=event["kind"],
            at=event["created_at"], until=event["created_at"], count=1,
            from_state=event["from_state"], to_state=event["to_state"],
            server_state=event["server_state"], data=dict(event["data"] or {}),
        ))
    _name_users(entries)
    return entries


def _name_users(entries: list[TimelineEntry]) -> None:
    """Events record who acted by user id in some places and by user name in others: show names."""
    ids = {e.data[k] for e in entries for k in USER_ID_KEYS if isinstance(e.data.get(k), int)}
    if not ids:
        return
    names = dict(get_user_model().objects.filter(pk__in=ids).values_list("pk", "username"))
    for entry in entries:
        for key in USER_ID_KEYS:
            value = entry.data.get(key)
            if isinstance(value, int):
                entry.data[key] = names.get(value, f"user #{value} (deleted)")


def timeline_page(*, operation_id: Any, page_number: Any) -> Page[TimelineEntry]:
    """One page of the folded timeline of an operation (the last page for a bad page number)."""
    events = (OperationEvent.objects.filter(operation_id=operation_id).order_by("seq")
              .values("seq", "kind", "from_state", "to_state", "server_state", "data", "created_at"))
    paginator = Paginator(timeline_fold(events.iterator(chunk_size=500)), PAGE_SIZE)
    return paginator.get_page(page_number)
