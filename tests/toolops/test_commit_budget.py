"""Commits and statements per step of one completed call, against PostgreSQL and the reference
MCP server, with real commits (a transactional test). Fails above the budget, so the figure
cannot silently regress.

A "commit" is what PostgreSQL counts in `xact_commit`: every statement run outside a transaction
block is one, and every outermost `atomic()` block is one, whatever it holds. The counter below
sees both through Django's execute wrapper.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from ledger.models import Operation, OutboxEvent, TerminalReceipt, ToolServer
from ledger.states import State
from toolops.services.dispatch import operations_claim_due
from toolops.services.observe import operation_poll
from toolops.services.servers import server_add
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db(transaction=True)

# Per completed call: submit (row before the send, reply after), one working poll, one terminal
# poll that records status, result, receipt and outbox row in one statement; each poll task
# also reads its row once. The claim is counted apart: one transaction per batch of due rows.
BUDGET = {"submit": 2, "working_poll": 2, "terminal_poll": 2, "next_submit": 2}
CALL_BUDGET = 6
CLAIM_BUDGET = 1
# Statements per step (savepoints included; neither the submit's insert nor acceptance takes
# one): the server with the adapter's status and the rollout rows (one statement), the row
# with its `created` event (its key check is the insert's own) and the reply with its
# `submitted` event at submit; the row's read and one
# guarded UPDATE for a working poll; the row's read and one statement for the terminal poll:
# the status, the result and the final state, the receipt, its outbox row, the events of the way
# there and the accepted event (toolops/services/settle_cycle.py), with no BEGIN or COMMIT.
# A later submit to the same server and tool, on the admission this process remembers, makes
# its first commit one statement: the locks, the check that the rows are the versions read, the
# row and its event (toolops/services/admission.py); then the reply.
STATEMENT_BUDGET = {"submit": 3, "working_poll": 2, "terminal_poll": 2, "next_submit": 2}
# Commits that write and wait for their WAL flush (ledger/flush.py), exactly: both of the
# submit's (the row before the send, the reply the caller is told) and the acceptance; a working
# poll's write is bookkeeping whose commit does not wait, and a read writes no WAL. A flush more
# is a cost; a flush less would make a step's promise lost in a crash.
FLUSHES = {"submit": 2, "working_poll": 0, "terminal_poll": 1, "next_submit": 2}
CLAIM_FLUSHES = 0
_WRITES = ("UPDATE", "INSERT", "DELETE", "WITH")


@dataclass
class Tally:
    statements: int = 0
    transactions: set[Any] = field(default_factory=set)
    sql: list[str] = field(default_factory=list)
    writing: set[Any] = field(default_factory=set)
    deferred: set[Any] = field(default_factory=set)

    @property
    def commits(self) -> int:
        return len(self.transactions)

    @property
    def flushes(self) -> int:
        """Transactions that wrote and whose commit waits for the WAL flush."""
        return len(self.writing - self.deferred)


@contextmanager
def counting() -> Iterator[Tally]:
    tally = Tally()
    serial = iter(range(10**9))

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        tally.statements += 1
        tally.sql.append(sql[:120])
        if connection.in_atomic_block and connection.atomic_blocks:
            # One PostgreSQL transaction per outermost atomic block.
            key: Any = ("atomic", id(connection.atomic_blocks[0]))
        else:
            key = ("autocommit", next(serial))
        tally.transactions.add(key)
        if sql.lstrip().upper().startswith(_WRITES):
            tally.writing.add(key)
        if "'synchronous_commit', 'off'" in sql:
            tally.deferred.add(key)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield tally


def _claim_one(op: Operation) -> str:
    """Make the row due and claim it (the dispatcher's transaction)."""
    Operation.objects.filter(id=op.id).update(next_poll_at=timezone.now() - timedelta(seconds=1))
    owner = f"budget-{op.id.hex[:8]}"
    with counting() as claim:
        ids = operations_claim_due(owner=owner)
    assert ids == [op.id]
    assert claim.commits <= CLAIM_BUDGET, claim.sql
    assert claim.flushes == CLAIM_FLUSHES, claim.sql
    return owner


@pytest.fixture
def server(mcp_url: str) -> ToolServer:
    return server_add(name="budget", url=mcp_url)


def test_commits_per_step_of_a_completed_call(server: ToolServer) -> None:
    with counting() as submit:
        op = operation_submit(server_name=server.name, tool_name="sleep_then_complete",
                              call_node_id="budget-1", arguments={"seconds": 1.5, "value": "ok"},
                              ttl_ms=60_000,
                              # As the API submits under an Idempotency-Key: the key's check is
                              # the insert's own, not a statement of its own.
                              submission_key="budget-key-1")
    assert op.state == State.WORKING, op.state

    owner = _claim_one(op)
    with counting() as working:
        outcome = operation_poll(operation_id=op.id, lease_owner=owner)
    assert outcome == "working"

    deadline = time.monotonic() + 20
    terminal = None
    while time.monotonic() < deadline:
        time.sleep(0.3)
        owner = _claim_one(op)
        with counting() as tally:
            outcome = operation_poll(operation_id=op.id, lease_owner=owner)
        if outcome.startswith("accepted"):
            terminal = tally
            break
        assert outcome == "working"
    assert terminal is not None, "the task never completed"
    assert TerminalReceipt.objects.filter(operation_id=op.id).count() == 1
    assert OutboxEvent.objects.filter(receipt__operation_id=op.id).count() == 1
    assert Operation.objects.get(id=op.id).state == State.ACCEPTED

    with counting() as next_submit:
        later = operation_submit(server_name=server.name, tool_name="sleep_then_complete",
                                 call_node_id="budget-2", arguments={"seconds": 0.1, "value": "ok"},
                                 ttl_ms=60_000, submission_key="budget-key-2")
    assert later.state == State.WORKING, later.state

    steps = {"submit": submit, "working_poll": working, "terminal_poll": terminal,
             "next_submit": next_submit}
    report = {name: (t.commits, t.statements, t.flushes) for name, t in steps.items()}
    print("commits, statements, flushed commits per step:", report)
    for name, tally in steps.items():
        assert tally.flushes == FLUSHES[name], (name, tally.flushes, tally.sql)
        assert tally.commits <= BUDGET[name], (name, tally.commits, tally.sql)
        assert tally.statements <= STATEMENT_BUDGET[name], (name, tally.statements, tally.sql)
    assert sum(steps[name].commits for name in ("submit", "working_poll", "terminal_poll")) \
        <= CALL_BUDGET
