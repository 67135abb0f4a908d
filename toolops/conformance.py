"""The conformance table: every place a server states a status, every status, and what we do.

For each adapter, each POSITION where a server's answer states a task status (the create reply,
a status read, the result read, the cancel reply, a list, a pushed notification, AIP-151's
operation fields, the extension's `tasks/get`) crossed with each status the protocol allows,
plus one the protocol does not know, gives the local move (from-state -> to-state, or a stay)
and the event the ledger records. A combination the protocol forbids is a protocol violation:
the row stays (or goes to SUBMISSION_UNKNOWN / reconciliation, as listed) with an event naming
the reason, never a crash. `tests/toolops/test_conformance.py` checks that every move here is in
the state table (ledger/states.py) and that every cell is walked by
`tests/toolops/test_conformance_<adapter>.py` against a server told to answer that way (or named
with the reason it cannot be). docs/conformance.md prints this table for readers.

Plain data: importable without Django's app registry beyond ledger.states.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.states import State

S = State

SHAPE_A = "mcp-tasks/2025-11-25"
SHAPE_B = "mcp-tasks-ext/2026-07-28"
AIP = "aip-151/v1"

MCP_STATUSES = ("working", "input_required", "completed", "failed", "cancelled")
UNKNOWN = "<unknown>"  # any status string the protocol does not define, e.g. "paused"


@dataclass(frozen=True)
class Cell:
    adapter: str
    position: str
    status: str  # the server's status (AIP-151: a description of the operation's fields)
    from_state: State  # the local state the answer is read in
    to_state: State | None  # None: the row stays where it is
    event: str  # the event kind recorded
    violation: str = ""  # non-empty: a protocol violation, and why

    @property
    def moves(self) -> bool:
        return self.to_state is not None and self.to_state != self.from_state


def _create_reply(adapter: str) -> list[Cell]:
    """`tools/call` answered with a task: any status is allowed in the reply."""
    cells = [
        Cell(adapter, "create_reply", "working", S.SUBMITTING, S.WORKING, "submitted"),
        # Round 1 opens with the reply; if its request cannot be read yet the row is WORKING
        # (due now) and the next poll opens it (toolops/services/inputs.py).
        Cell(adapter, "create_reply", "input_required", S.SUBMITTING, S.INPUT_REQUIRED,
             "input_round_opened"),
        Cell(adapter, "create_reply", "completed", S.SUBMITTING, S.TERMINAL_OBSERVED,
             "terminal_observed"),
        Cell(adapter, "create_reply", "failed", S.SUBMITTING, S.TERMINAL_OBSERVED,
             "terminal_observed"),
        Cell(adapter, "create_reply", "cancelled", S.SUBMITTING, S.TERMINAL_OBSERVED,
             "terminal_observed"),
        # The server got the call and may hold a task: never resent, resolved by key.
        Cell(adapter, "create_reply", UNKNOWN, S.SUBMITTING, S.SUBMISSION_UNKNOWN,
             "submission_unknown", violation="create reply with a status the protocol lacks"),
    ]
    return cells


def _status_read(adapter: str, position: str) -> list[Cell]:
    """A status read of a running task (`tasks/get`, AIP-151 `GetOperation`, a list entry)."""
    return [
        # Unchanged (same status, message and progress): no event row, the row's poll counter
        # (`polls_count`); a changed message or progress is an `observed` event.
        Cell(adapter, position, "working", S.WORKING, None, "polls_count"),
        Cell(adapter, position, "input_required", S.WORKING, S.INPUT_REQUIRED,
             "input_round_opened"),
        Cell(adapter, position, "completed", S.WORKING, S.TERMINAL_OBSERVED, "terminal_observed"),
        Cell(adapter, position, "failed", S.WORKING, S.TERMINAL_OBSERVED, "terminal_observed"),
        # Cancelled without our cancel (an operator on the server, the server's own policy): a
        # terminal status like any other; the receipt says `cancelled`.
        Cell(adapter, position, "cancelled", S.WORKING, S.TERMINAL_OBSERVED, "terminal_observed"),
        Cell(adapter, position, UNKNOWN, S.WORKING, None, "poll_error",
             violation="status the protocol lacks; the row keeps polling with backoff"),
        # While a cancel is pending polling never pauses; the terminal status decides.
        Cell(adapter, position, "working", S.CANCEL_REQUESTED, None, "observed"),
        Cell(adapter, position, "input_required", S.CANCEL_REQUESTED, None, "observed"),
        Cell(adapter, position, "cancelled", S.CANCEL_REQUESTED, S.CANCELLED_ACCEPTED,
             "cancel_confirmed"),
        Cell(adapter, position, "completed", S.CANCEL_REQUESTED, S.TERMINAL_OBSERVED,
             "terminal_observed"),
        Cell(adapter, position, "failed", S.CANCEL_REQUESTED, S.TERMINAL_OBSERVED,
             "terminal_observed"),
    ]


def _list_and_lookup(adapter: str) -> list[Cell]:
    """`tasks/list` entries are CANDIDATES for an operator (a listed task carries no key): the list
    is read when nothing can prove the row's task (no key lookup, or its deadline passed), and the
    row goes to the operator with the listed tasks in the evidence, whatever their status. A task
    found by submission key resolves the row to WORKING whatever its status, and the `get` that
    follows at once decides from there."""
    cells = [Cell(adapter, "list", status, S.SUBMISSION_UNKNOWN, S.RECONCILIATION_REQUIRED,
                  "reconciliation_required") for status in MCP_STATUSES]
    cells.append(Cell(adapter, "list", UNKNOWN, S.SUBMISSION_UNKNOWN, S.RECONCILIATION_REQUIRED,
                      "reconciliation_required",
                      violation="list entry with a status the protocol lacks: no candidates"))
    cells += [Cell(adapter, "lookup_by_key", status, S.SUBMISSION_UNKNOWN, S.WORKING,
                   "submission_resolved") for status in MCP_STATUSES]
    return cells


def _cancel_reply(adapter: str, *, confirms: bool) -> list[Cell]:
    """`tasks/cancel` answered with a task. 2025-11-25 moves the task to `cancelled` before it
    replies; the others only acknowledge, so a non-terminal reply is normal there."""
    # The same event for every shape: the reply is no evidence, polling decides.
    non_terminal_event = "cancel_reply_not_cancelled"
    return [
        Cell(adapter, "cancel_reply", "cancelled", S.CANCEL_REQUESTED, S.CANCELLED_ACCEPTED,
             "cancel_confirmed"),
        # No evidence either way: keep polling until the server names the terminal state.
        Cell(adapter, "cancel_reply", "working", S.CANCEL_REQUESTED, None, non_terminal_event,
             violation="cancel reply is not terminal" if confirms else ""),
        Cell(adapter, "cancel_reply", "input_required", S.CANCEL_REQUESTED, None,
             non_terminal_event, violation="cancel reply is not terminal" if confirms else ""),
        # Completion won the race with the cancel: the next poll accepts what the server says.
        Cell(adapter, "cancel_reply", "completed", S.CANCEL_REQUESTED, None, non_terminal_event),
        Cell(adapter, "cancel_reply", "failed", S.CANCEL_REQUESTED, None, non_terminal_event),
        Cell(adapter, "cancel_reply", UNKNOWN, S.CANCEL_REQUESTED, None, "cancel_send_failed",
             violation="cancel reply with a status the protocol lacks"),
    ]


def _cancel_refused_read(adapter: str) -> list[Cell]:
    """The status read that follows a `tasks/cancel` refused with -32602 ("already terminal", a
    2025-11-25 answer): only a terminal status read there says how the task ended. A read that
    contradicts the refusal (a reordered or stale answer) is no evidence of anything; the cancel
    stands and polling decides, exactly as for a lost acknowledgement."""
    contradicted = "tasks/cancel said already terminal; the read says otherwise"
    return [
        Cell(adapter, "cancel_refused_read", "working", S.CANCEL_REQUESTED, None,
             "cancel_reply_contradicted", violation=contradicted),
        Cell(adapter, "cancel_refused_read", "input_required", S.CANCEL_REQUESTED, None,
             "cancel_reply_contradicted", violation=contradicted),
        Cell(adapter, "cancel_refused_read", "cancelled", S.CANCEL_REQUESTED,
             S.CANCELLED_ACCEPTED, "cancel_confirmed"),
        # Completion won the race: that terminal state is fetched and accepted, the cancel lost.
        Cell(adapter, "cancel_refused_read", "completed", S.CANCEL_REQUESTED,
             S.TERMINAL_OBSERVED, "terminal_observed"),
        Cell(adapter, "cancel_refused_read", "failed", S.CANCEL_REQUESTED, S.TERMINAL_OBSERVED,
             "terminal_observed"),
        Cell(adapter, "cancel_refused_read", UNKNOWN, S.CANCEL_REQUESTED, None, "cancel_ack_lost",
             violation="status the protocol lacks; the cancel stands, polling decides"),
    ]


def _result_read(adapter: str) -> list[Cell]:
    return [
        Cell(adapter, "result", "completed", S.FETCHING_RESULT, S.ACCEPTED, "accepted"),
        Cell(adapter, "result", "failed", S.FETCHING_RESULT, S.ACCEPTED, "accepted"),
        Cell(adapter, "result", "cancelled", S.FETCHING_RESULT, S.ACCEPTED, "accepted"),
    ]


def _notification(adapter: str) -> list[Cell]:
    """`notifications/tasks/status` is a hint, never a state: it only makes the row due now."""
    return [Cell(adapter, "notification", status, S.WORKING, None, "poll_sooner")
            for status in (*MCP_STATUSES, UNKNOWN)]


def _extension_get() -> list[Cell]:
    """Shape B: `tasks/get` carries the outcome inline and pending `inputRequests`."""
    return [
        Cell(SHAPE_B, "ext_get_inline", "completed+result", S.WORKING, S.TERMINAL_OBSERVED,
             "terminal_observed"),
        Cell(SHAPE_B, "ext_get_inline", "failed+error", S.WORKING, S.TERMINAL_OBSERVED,
             "terminal_observed"),
        Cell(SHAPE_B, "ext_get_inline", "completed without result", S.WORKING, None,
             "poll_error", violation="completed task without a CallToolResult"),
        Cell(SHAPE_B, "ext_get_inline", "failed without error", S.WORKING, None, "poll_error",
             violation="failed task without an error object"),
        Cell(SHAPE_B, "ext_get_inline", "input_required+inputRequests+result", S.WORKING, None,
             "poll_error", violation="input requests and an outcome in one task"),
        Cell(SHAPE_B, "ext_get_inline", "input_required+inputRequests", S.WORKING,
             S.INPUT_REQUIRED, "input_round_opened"),
        # A request key already answered comes back on every get until the server moves on.
        Cell(SHAPE_B, "ext_get_inline", "input_required+answered key", S.WORKING, None,
             "input_required_no_new_round"),
    ]


def _aip_fields() -> list[Cell]:
    """AIP-151 has no status string: `done` and `response` / `error` (code 1 = CANCELLED)."""
    return [
        Cell(AIP, "operation_fields", "done:false", S.WORKING, None, "observed"),
        Cell(AIP, "operation_fields", "done:true+response", S.WORKING, S.TERMINAL_OBSERVED,
             "terminal_observed"),
        Cell(AIP, "operation_fields", "done:true+error(code 1)", S.WORKING, S.TERMINAL_OBSERVED,
             "terminal_observed"),
        Cell(AIP, "operation_fields", "done:true+error(other code)", S.WORKING,
             S.TERMINAL_OBSERVED, "terminal_observed"),
        Cell(AIP, "operation_fields", "done:true, neither", S.WORKING, None, "poll_error",
             violation="done operation must carry exactly one of response/error"),
        Cell(AIP, "operation_fields", "done:true, both", S.WORKING, None, "poll_error",
             violation="done operation must carry exactly one of response/error"),
        Cell(AIP, "operation_fields", "done not a boolean", S.WORKING, None, "poll_error",
             violation="operation `done` is not a boolean"),
        Cell(AIP, "create_reply", "done:false", S.SUBMITTING, S.WORKING, "submitted"),
        Cell(AIP, "create_reply", "done:true+response", S.SUBMITTING, S.TERMINAL_OBSERVED,
             "terminal_observed"),
        Cell(AIP, "create_reply", "done:true, neither", S.SUBMITTING, S.SUBMISSION_UNKNOWN,
             "submission_unknown", violation="done operation must carry exactly one of "
             "response/error"),
    ]


def conformance_table() -> list[Cell]:
    cells: list[Cell] = []
    cells += _create_reply(SHAPE_A) + _status_read(SHAPE_A, "get") + _list_and_lookup(SHAPE_A)
    cells += _cancel_reply(SHAPE_A, confirms=True) + _cancel_refused_read(SHAPE_A)
    cells += _result_read(SHAPE_A) + _notification(SHAPE_A)
    cells += _create_reply(SHAPE_B) + _status_read(SHAPE_B, "get") + _extension_get()
    cells += _cancel_reply(SHAPE_B, confirms=False) + _result_read(SHAPE_B)
    cells += _notification(SHAPE_B)
    cells += _aip_fields() + _cancel_reply(AIP, confirms=False) + _result_read(AIP)
    return cells


def cells_for(*, adapter: str, position: str | None = None) -> list[Cell]:
    return [c for c in conformance_table()
            if c.adapter == adapter and (position is None or c.position == position)]


def conformance_markdown() -> str:
    """The table as docs/conformance.md prints it (a test keeps the two in step)."""
    lines = ["| adapter | position | server says | in | to | event | violation |",
             "|---|---|---|---|---|---|---|"]
    for c in conformance_table():
        lines.append(f"| {c.adapter} | {c.position} | `{c.status}` | {c.from_state} | "
                     f"{c.to_state or 'stays'} | `{c.event}` | {c.violation} |")
    return "\n".join(lines)
