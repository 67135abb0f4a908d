"""The conformance table against the state table and the docs (no server needed)."""

from __future__ import annotations

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
