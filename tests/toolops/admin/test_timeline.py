"""Folding an event series: runs of unchanged polls become one entry; changes never fold."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User

from toolops.admin.timeline import timeline_fold

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def _event(seq: int, kind: str, frm: str, to: str, server: str = "working", **data: Any) -> dict[str, Any]:
    return {"seq": seq, "kind": kind, "from_state": frm, "to_state": to, "server_state": server,
            "data": data, "created_at": T0 + timedelta(seconds=seq)}


def test_unchanged_polls_fold_and_state_changes_stand_alone() -> None:
    events = [_event(1, "submitted", "SUBMITTING", "WORKING"),
              *[_event(s, "observed", "WORKING", "WORKING", pollInterval=s) for s in range(2, 12)],
              _event(12, "observed", "WORKING", "WORKING", server="input_required"),
              _event(13, "observed", "WORKING", "INPUT_REQUIRED", server="input_required"),
              _event(14, "observed", "INPUT_REQUIRED", "INPUT_REQUIRED", server="input_required")]
    entries = timeline_fold(events)
    assert [(e.first_seq, e.last_seq, e.count) for e in entries] == [
        (1, 1, 1), (2, 11, 10), (12, 12, 1), (13, 13, 1), (14, 14, 1)]
    folded = entries[1]
    assert folded.folded and not folded.state_change
    assert folded.at == T0 + timedelta(seconds=2) and folded.until == T0 + timedelta(seconds=11)
    assert folded.data == {"pollInterval": 11}  # the run's last data
    assert entries[0].state_change and entries[3].state_change


def test_other_kinds_never_fold_even_when_repeated() -> None:
    events = [_event(s, "cancel_refused", "WORKING", "WORKING") for s in (1, 2, 3)]
    assert [e.count for e in timeline_fold(events)] == [1, 1, 1]


@pytest.mark.django_db
def test_answerers_are_shown_by_user_name() -> None:
    ana = User.objects.create_user("ana")
    entries = timeline_fold([_event(1, "input_answered", "INPUT_REQUIRED", "INPUT_REQUIRED",
                                    answered_by=ana.pk),
                             _event(2, "input_answered", "INPUT_REQUIRED", "INPUT_REQUIRED",
                                    answered_by=ana.pk + 1000)])
    assert entries[0].data["answered_by"] == "ana"
    assert entries[1].data["answered_by"] == f"user #{ana.pk + 1000} (deleted)"
