"""ledger.services.schedule: the one module that spells writes of the schedule and the lease.

Two parts: what each builder writes, and a scan of the product source that fails when any other
module writes `next_poll_at`, `lease_owner` or `lease_expires_at` itself (a keyword of an ORM
write, a key of a dict literal, an item or attribute assignment). Reads (filters, ordering,
`F()` references, `.get("next_poll_at")`) are not writes and are not flagged. The scanner is
also run on planted snippets so it is known to bite.
"""

from __future__ import annotations

import ast
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db.models import F

from ledger.services.schedule import (
    RELEASE,
    schedule_at,
    schedule_cleared,
    schedule_leased,
    schedule_now,
)

REPO = Path(__file__).resolve().parents[2]
FIELDS = frozenset({"next_poll_at", "lease_owner", "lease_expires_at"})
OWNER = Path("ledger/services/schedule.py")
# ORM calls that write the fields named in their keywords.
WRITE_CALLS = frozenset({"update", "create", "update_or_create", "get_or_create", "Operation"})
# Keyword arguments that carry a field dict into a guarded write.
WRITE_KEYWORDS = frozenset({"updates", "defaults"})
# Names the services give the field dicts they hand to a write.
WRITE_NAMES = frozenset({"fields", "updates"})


def _dict_writes(node: ast.AST | None) -> list[tuple[int, str]]:
    if not isinstance(node, ast.Dict):
        return []
    return [(node.lineno, str(key.value)) for key in node.keys
            if isinstance(key, ast.Constant) and key.value in FIELDS]


def _writes(source: str) -> list[tuple[int, str]]:
    """(line, field) of every write of a schedule field in `source`.

    A write is: a keyword of an ORM write call; a key of a dict literal handed to a guarded write
    (`updates=`, `defaults=`) or bound to a name such a write takes (`fields`, `updates`); an item
    assigned into such a dict; an attribute assigned on a model instance. Lookup dicts
    (`filters`) and event data are reads or records, not writes of the row.
    """
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in WRITE_CALLS:
                found += [(node.lineno, kw.arg) for kw in node.keywords if kw.arg in FIELDS]
            for kw in node.keywords:
                if kw.arg in WRITE_KEYWORDS:
                    found += _dict_writes(kw.value)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in WRITE_NAMES:
                    found += _dict_writes(node.value)
                if isinstance(target, ast.Attribute) and target.attr in FIELDS:
                    found.append((node.lineno, target.attr))
                if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                        and target.value.id in WRITE_NAMES
                        and isinstance(target.slice, ast.Constant) and target.slice.value in FIELDS):
                    found.append((node.lineno, str(target.slice.value)))
    return found


def _product_files() -> list[Path]:
    files = []
    for package in ("ledger", "toolops"):
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO)
            if "migrations" in rel.parts or rel == OWNER:
                continue
            files.append(rel)
    return files


def test_no_module_but_the_owner_writes_the_schedule() -> None:
    offenders = [f"{rel}:{line}: {field}" for rel in _product_files()
                 for line, field in _writes((REPO / rel).read_text())]
    assert not offenders, (
        "schedule and lease writes must come from ledger.services.schedule:\n" + "\n".join(offenders))


@pytest.mark.parametrize("snippet", [
    'Operation.objects.filter(id=1).update(next_poll_at=now)',
    'operation_transition(updates={"next_poll_at": None})',
    'fields["lease_expires_at"] = until',
    'updates = {"next_poll_at": now, "state": s}',
    'op.lease_owner = "w1"',
    'Operation.objects.create(lease_owner="w1", lease_expires_at=until)',
    'Operation(next_poll_at=now)',
])
def test_the_scan_flags_a_planted_write(snippet: str) -> None:
    assert _writes(snippet), snippet


@pytest.mark.parametrize("snippet", [
    'Operation.objects.filter(next_poll_at__lte=now, lease_owner=owner)',
    'qs.order_by("next_poll_at").values("next_poll_at")',
    'fields.get("next_poll_at")',
    'Coalesce(F("next_poll_at"), now)',
    'op.lease_owner != owner',
    'filters["lease_owner"] = owner',
    'event_append(data={"lease_owner": owner, "next_poll_at": at})',
])
def test_the_scan_leaves_reads_alone(snippet: str) -> None:
    assert not _writes(snippet), snippet


def test_builders_release_by_default_and_keep_the_lease_on_request() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    assert schedule_at(at=at) == {**RELEASE, "next_poll_at": at}
    assert schedule_at(at=at, release=False) == {"next_poll_at": at}
    assert schedule_cleared() == {**RELEASE, "next_poll_at": None}
    assert schedule_cleared(release=False) == {"next_poll_at": None}
    expression = F("next_poll_at")
    assert schedule_at(at=expression, release=False)["next_poll_at"] is expression


def test_schedule_now_is_due_now() -> None:
    before = datetime.now(UTC)
    fields = schedule_now()
    assert before <= fields["next_poll_at"] <= datetime.now(UTC)
    assert fields["lease_owner"] == "" and fields["lease_expires_at"] is None


def test_a_leased_row_is_due_again_when_its_lease_ends() -> None:
    until = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=30)
    assert schedule_leased(owner="w1", until=until) == {
        "lease_owner": "w1", "lease_expires_at": until, "next_poll_at": until}
