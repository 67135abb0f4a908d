"""The conformance table against the state table and the docs (no server needed)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from ledger.states import TRANSITIONS
from toolops.conformance import (
    AIP,
    SHAPE_A,
    SHAPE_B,
    UNKNOWN,
    Cell,
    conformance_markdown,
    conformance_table,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"


def _id(c: Cell) -> str:
    return f"{c.adapter}:{c.position}:{c.status}:{c.from_state}"


@pytest.mark.parametrize("cell", conformance_table(), ids=_id)
def test_every_move_the_table_names_is_in_the_state_table(cell: Cell) -> None:
    if cell.moves:
        assert cell.to_state in TRANSITIONS[cell.from_state], (
            f"{cell.from_state} -> {cell.to_state} is not in ledger/states.py")
    if cell.violation:
        # A violation never moves a row forward to a terminal or input state.
        assert cell.to_state is None or cell.to_state.value in ("SUBMISSION_UNKNOWN",
                                                                "RECONCILIATION_REQUIRED")


def test_every_status_position_has_every_status_and_an_unknown_one() -> None:
    for adapter in (SHAPE_A, SHAPE_B):
        for position in ("create_reply", "get", "cancel_reply", "notification"):
            statuses = {c.status for c in conformance_table()
                        if c.adapter == adapter and c.position == position}
            assert {"working", "input_required", "completed", "failed", "cancelled"} <= statuses
            assert UNKNOWN in statuses, (adapter, position)
    aip = {c.status for c in conformance_table() if c.adapter == AIP}
    assert "done:true, neither" in aip and "done:true, both" in aip


def test_the_issue_cases_are_cells() -> None:
    table = {(c.adapter, c.position, c.status, c.from_state): c for c in conformance_table()}
    assert table[(SHAPE_A, "create_reply", "input_required", "SUBMITTING")].to_state == "INPUT_REQUIRED"
    for status in ("completed", "failed", "cancelled"):
        assert table[(SHAPE_A, "create_reply", status, "SUBMITTING")].to_state == "TERMINAL_OBSERVED"
    assert table[(SHAPE_A, "get", "cancelled", "WORKING")].to_state == "TERMINAL_OBSERVED"
    assert table[(SHAPE_A, "cancel_reply", "working", "CANCEL_REQUESTED")].violation
    assert table[(AIP, "operation_fields", "done:true, neither", "WORKING")].violation
    assert table[(SHAPE_B, "ext_get_inline", "input_required+inputRequests+result", "WORKING")].violation


def test_docs_print_the_table_as_the_code_has_it() -> None:
    assert conformance_markdown() in DOC.read_text(), (
        "docs/conformance.md is out of step: paste toolops.conformance.conformance_markdown()")


# The walk modules: one per adapter; each cell is walked by a test parametrized over `cell`.
WALK_MODULES = (
    "tests.toolops.test_conformance_mcp_tasks_2025",
    "tests.toolops.test_conformance_mcp_tasks_ext_2026",
    "tests.toolops.test_conformance_aip151",
)
# Cells no server can be told to produce, with the reason. Each one is a stated gap: a cell
# that gains a walk must leave this list (checked below), and a new cell must gain a walk or
# a line here.
NOT_WALKED: dict[tuple[str, str, str, str], str] = {
    # AIP-151 has no input state: no operation can say `input_required`.
    (AIP, "cancel_reply", "input_required", "CANCEL_REQUESTED"):
        "AIP-151 operations have no input_required state",
}


def _key(c: Cell) -> tuple[str, str, str, str]:
    return (c.adapter, c.position, c.status, str(c.from_state))


def walked_cells() -> dict[tuple[str, str, str, str], list[str]]:
    """Every cell a walk module's tests are parametrized over, with the tests walking it.

    Read from the `parametrize` marks pytest itself expands, so a cell counts only if a test
    is generated for it."""
    walked: dict[tuple[str, str, str, str], list[str]] = {}
    for name in WALK_MODULES:
        module = importlib.import_module(name)
        for attr, fn in vars(module).items():
            if not attr.startswith("test_") or not callable(fn):
                continue
            for mark in getattr(fn, "pytestmark", []):
                if mark.name == "parametrize" and mark.args[0] == "cell":
                    for c in mark.args[1]:
                        walked.setdefault(_key(c), []).append(f"{name.rsplit('.', 1)[1]}::{attr}")
    return walked


def test_every_cell_of_the_table_is_walked_against_a_server() -> None:
    walked = walked_cells()
    table = {_key(c) for c in conformance_table()}
    missing = sorted(k for k in table if k not in walked and k not in NOT_WALKED)
    assert not missing, f"cells without a walking test (or a stated reason): {missing}"
    stale = sorted(k for k in NOT_WALKED if k in walked or k not in table)
    assert not stale, f"NOT_WALKED names cells that are walked or not in the table: {stale}"
    # A cell skipped inside its test is not walked: gaps go in NOT_WALKED, with their reason.
    for name in WALK_MODULES:
        source = Path(importlib.import_module(name).__file__ or "").read_text()
        assert "pytest.skip(" not in source and "mark.skip" not in source, name
