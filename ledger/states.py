"""Local states and the one state table (docs/state-table.md explains each move).

Local states are ours; the server's status is stored verbatim in `Operation.server_state` and is
never renamed into one of these.
"""

from __future__ import annotations

from django.db import models


class State(models.TextChoices):
    SUBMITTING = "SUBMITTING"
    SUBMISSION_UNKNOWN = "SUBMISSION_UNKNOWN"
    WORKING = "WORKING"
    INPUT_REQUIRED = "INPUT_REQUIRED"
    CANCEL_REQUESTED = "CANCEL_REQUESTED"
    TERMINAL_OBSERVED = "TERMINAL_OBSERVED"
    FETCHING_RESULT = "FETCHING_RESULT"
    ACCEPTED = "ACCEPTED"
    CANCELLED_ACCEPTED = "CANCELLED_ACCEPTED"
    NOT_FOUND_SAFE = "NOT_FOUND_SAFE"
    RECONCILIATION_REQUIRED = "RECONCILIATION_REQUIRED"
    ABANDONED = "ABANDONED"


S = State

# The state table: from-state -> the states it may move to. Anything absent is illegal.
#
# Beyond the basic lifecycle:
# - SUBMITTING -> TERMINAL_OBSERVED: a synchronous fallback call (or a create reply that is already
#   terminal) hands us the terminal result with the submit answer itself.
# - SUBMITTING -> INPUT_REQUIRED: a create reply may carry any task status; one that is already
#   `input_required` opens input round 1, the remote id recorded in the same transaction.
# The conformance table (toolops/conformance.py) names, per adapter, every position where a
# server states a status and the move each status causes; a test checks each move is in here.
# - CANCEL_REQUESTED -> INPUT_REQUIRED | WORKING: a cancel whose ack was lost keeps polling, and the
#   server may still report those; the cancel generation stays bumped, so acceptance still checks it.
# - every in-flight state -> RECONCILIATION_REQUIRED: what the executor cannot prove (404 without a
#   receipt, lost session, budget exhausted) goes to the manual queue, never silently stops.
# - RECONCILIATION_REQUIRED resolutions: a remote id found by hand (WORKING), proof of never created
#   (NOT_FOUND_SAFE), a terminal state observed with evidence (TERMINAL_OBSERVED), abandoned.
TRANSITIONS: dict[State, frozenset[State]] = {
    S.SUBMITTING: frozenset(
        {S.WORKING, S.INPUT_REQUIRED, S.SUBMISSION_UNKNOWN, S.TERMINAL_OBSERVED}
    ),
    S.SUBMISSION_UNKNOWN: frozenset({S.WORKING, S.NOT_FOUND_SAFE, S.RECONCILIATION_REQUIRED}),
    S.WORKING: frozenset(
        {S.INPUT_REQUIRED, S.CANCEL_REQUESTED, S.TERMINAL_OBSERVED, S.RECONCILIATION_REQUIRED}
    ),
    S.INPUT_REQUIRED: frozenset(
        {S.WORKING, S.CANCEL_REQUESTED, S.TERMINAL_OBSERVED, S.RECONCILIATION_REQUIRED}
    ),
    S.CANCEL_REQUESTED: frozenset(
        {
            S.CANCELLED_ACCEPTED,
            S.TERMINAL_OBSERVED,
            S.WORKING,
            S.INPUT_REQUIRED,
            S.RECONCILIATION_REQUIRED,
        }
    ),
    S.TERMINAL_OBSERVED: frozenset({S.FETCHING_RESULT, S.RECONCILIATION_REQUIRED}),
    S.FETCHING_RESULT: frozenset({S.ACCEPTED, S.RECONCILIATION_REQUIRED}),
    S.RECONCILIATION_REQUIRED: frozenset(
        {S.WORKING, S.NOT_FOUND_SAFE, S.TERMINAL_OBSERVED, S.ABANDONED}
    ),
    S.ACCEPTED: frozenset(),
    S.CANCELLED_ACCEPTED: frozenset(),
    S.NOT_FOUND_SAFE: frozenset(),
    S.ABANDONED: frozenset(),
}

ABSORBING: frozenset[State] = frozenset(s for s, targets in TRANSITIONS.items() if not targets)

# States the dispatcher polls. INPUT_REQUIRED is paused until answered; SUBMITTING belongs to the
# submitting worker; SUBMISSION_UNKNOWN is resolved by lookup, not by polling a remote id.
POLLABLE: frozenset[State] = frozenset(
    {S.WORKING, S.CANCEL_REQUESTED, S.TERMINAL_OBSERVED, S.FETCHING_RESULT}
)

# Open means "not yet at a final answer": these are the rows a fleet still owes work on.
OPEN: frozenset[State] = frozenset(TRANSITIONS) - ABSORBING


def sources_of(target: State) -> frozenset[State]:
    """Every state from which `target` is reachable in one legal step."""
    return frozenset(src for src, targets in TRANSITIONS.items() if target in targets)


class TerminalStatus(models.TextChoices):
    """The terminal status a receipt records, in the server's own words (MCP Tasks)."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
