"""Fault cases 1-5: each named fault injected by the scriptable layer
(tests/peers/fault_transport.py) in the real HTTP path in front of the reference SDK server,
with the ledger on PostgreSQL, then the same five invariants (conftest.assert_invariants).
Cases 6-10 are in test_fault_cases_more.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from adapters.mcp_tasks_2025_inputs import RELATED_TASK_META
from ledger.models import (
    EffectReconciliation,
    InputRequest,
    Operation,
    ReconciliationItem,
    TerminalReceipt,
    ToolServer,
)
from ledger.states import State
from tests.concurrency import poll_in_thread
from tests.faults.conftest import (
    assert_invariants,
    claim_now,
    kinds,
    server_for,
    settle,
    submit,
    wait_server_status,
)
from tests.peers.fault_transport import FaultTransport, Rule
from tests.peers.launch import peer_lookup, running_reference_server
from toolops.services.cancel import operation_cancel
from toolops.services.inputs import operation_answer_input
from toolops.services.observe import operation_poll


@pytest.fixture(scope="module")
def coop_url() -> Iterator[str]:
    with running_reference_server(cooperating="full", poll_interval_ms=100) as url:
        yield url


def _status(status: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def rewrite(message: dict[str, Any]) -> dict[str, Any]:
        return {**message, "result": {**message["result"], "status": status}}
    return rewrite


# -- 1. the server creates the task but the initial response is lost -----------------------------

@pytest.mark.django_db
@pytest.mark.parametrize("cooperating", [False, True], ids=["plain", "cooperating"])
def test_case1_created_but_initial_response_lost(
        request: pytest.FixtureRequest, faults: FaultTransport, mcp_url: str,
        cooperating: bool) -> None:
    url = request.getfixturevalue("coop_url") if cooperating else mcp_url
    srv = server_for(url)
    drop = faults.script(Rule(action="drop", method="tools/call"))
    op = submit(srv, seconds=0.2, value="c1")
    assert drop.fired == 1
    # First: one operation on the server for the key, and the row findable by it.
    assert_invariants(mcp_url=url, ops=[op])
    assert op.state == State.SUBMISSION_UNKNOWN and not op.remote_id
    settle()
    op.refresh_from_db()
    if cooperating:
        # Resolved by the key lookup to the one task the lost call created.
        assert op.state == State.ACCEPTED and op.remote_id == peer_lookup(url, op.submission_key)
    else:
        # No way to prove which task is ours: the manual queue, never a resend.
        assert op.state == State.RECONCILIATION_REQUIRED and not op.remote_id
        assert ReconciliationItem.objects.get(operation=op).reason == "submission_unknown_no_lookup"
        assert not TerminalReceipt.objects.filter(operation=op).exists()
    assert faults.methods.count("tools/call") == 1
    assert_invariants(mcp_url=url, ops=[op])


# -- 2. two pollers return out of order -----------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_case2_two_pollers_return_out_of_order(faults: FaultTransport, server: ToolServer,
                                               mcp_url: str) -> None:
    op = submit(server, seconds=2.0, value="c2")
    hold = faults.script(Rule(action="hold", method="tasks/get", task_id=op.remote_id))
    out: list[str] = []
    claim_now(op, "w")
    old = poll_in_thread(op, "w", out)
    try:
        assert hold.wait_held()
        # The same worker's lease ran out; it claims the row again and polls: a newer answer.
        claim_now(op, "w")
        assert operation_poll(operation_id=op.id, lease_owner="w") == "working"
        # It holds the row again when the old answer lands: the lease matches, only the issued
        # sequence can refuse the older answer.
        claim_now(op, "w")
        newer = Operation.objects.get(id=op.id)
        events_before = len(kinds(op))
    finally:
        hold.release()
        old.join(30)
    assert out == ["stale_observation"]
    row = Operation.objects.get(id=op.id)
    assert (row.observation_seq, row.updated_at) == (newer.observation_seq, newer.updated_at)
    assert len(kinds(op)) == events_before
    Operation.objects.filter(id=op.id).update(lease_owner="", lease_expires_at=None,
                                              next_poll_at=timezone.now())
    settle()
    row.refresh_from_db()
    assert row.state == State.ACCEPTED and row.terminal_status == "completed"
    assert_invariants(mcp_url=mcp_url, ops=[op])


# -- 3. input_required replayed -------------------------------------------------------------------

@pytest.mark.django_db
def test_case3_input_required_replayed(faults: FaultTransport, server: ToolServer,
                                       mcp_url: str) -> None:
    op = submit(server, tool="ask_input", question="colour?", rounds=1)
    settle()
    op.refresh_from_db()
    assert op.state == State.INPUT_REQUIRED
    first = InputRequest.objects.get(operation=op, round=1)
    # After the answer, the next status answer replays `input_required` together with the
    # server request that round already answered.
    replayed = {"jsonrpc": "2.0", "id": json.loads(first.server_request_id), "method": first.method,
                "params": {**first.params, "_meta": {RELATED_TASK_META: {"taskId": op.remote_id}}}}
    replay = faults.script(Rule(action="rewrite", method="tasks/get", task_id=op.remote_id,
                                rewrite=_status("input_required"), prepend=[replayed]))
    assert operation_answer_input(operation_id=op.id, input_round=1,
                                  schema_digest=first.schema_digest,
                                  response={"value": "teal"}) == "delivered"
    settle()
    op.refresh_from_db()
    assert replay.fired == 1
    assert InputRequest.objects.filter(operation=op).count() == 1
    assert op.input_round == 1 and "input_required_no_new_round" in kinds(op)
    assert op.state == State.ACCEPTED and op.terminal_status == "completed"
    assert "teal" in json.dumps(op.result)
    assert_invariants(mcp_url=mcp_url, ops=[op])


# -- 4. completion and cancel arrive at the same time ---------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_case4_completion_and_cancel_at_the_same_time(faults: FaultTransport, server: ToolServer,
                                                      mcp_url: str) -> None:
    op = submit(server, seconds=0.2, value="c4")
    wait_server_status(server, op.remote_id, {"completed"})
    poll_hold = faults.script(Rule(action="hold", method="tasks/get", task_id=op.remote_id))
    cancel_hold = faults.script(Rule(action="hold", method="tasks/cancel", task_id=op.remote_id))
    polled: list[str] = []
    cancelled: list[str] = []
    claim_now(op, "p")
    poller = poll_in_thread(op, "p", polled)

    def cancel() -> None:
        try:
            cancelled.append(operation_cancel(operation_id=op.id))
        finally:
            connection.close()

    canceller = threading.Thread(target=cancel)
    try:
        assert poll_hold.wait_held()  # the poller holds "completed"
        canceller.start()
        assert cancel_hold.wait_held()  # the cancel is committed and its answer in flight
        assert Operation.objects.get(id=op.id).state == State.CANCEL_REQUESTED
        poll_hold.release()
        poller.join(30)
        # The poller's completion loses the row (cancel took the lease and the state).
        assert polled and not polled[0].startswith("accepted")
        assert not TerminalReceipt.objects.filter(operation=op).exists()
    finally:
        poll_hold.release()
        cancel_hold.release()
        poller.join(30)
        if canceller.is_alive() or canceller.ident is not None:
            canceller.join(30)
    assert cancelled == ["accepted:completed"]  # the server says the task had already ended
    row = Operation.objects.get(id=op.id)
    assert row.state == State.ACCEPTED
    assert TerminalReceipt.objects.get(operation=op).terminal_status == "completed"
    assert "cancel_lost" in kinds(op)
    assert_invariants(mcp_url=mcp_url, ops=[op])


# -- 5. the cancel acknowledgement is lost (and a late completion arrives after it) ----------------

@pytest.mark.django_db(transaction=True)
def test_case5_cancel_ack_lost_then_a_late_completion(faults: FaultTransport, server: ToolServer,
                                                      mcp_url: str) -> None:
    op = submit(server, seconds=30, value="never")
    # A poller's answer is in flight and says "completed" (a stale worker's view) ...
    late = faults.script(Rule(action="hold", method="tasks/get", task_id=op.remote_id,
                              rewrite=_status("completed")))
    polled: list[str] = []
    claim_now(op, "stale")
    poller = poll_in_thread(op, "stale", polled)
    try:
        assert late.wait_held()
        # ... while the cancel reaches the server, which cancels; its answer is lost.
        drop = faults.script(Rule(action="drop", method="tasks/cancel", task_id=op.remote_id))
        assert operation_cancel(operation_id=op.id) == "cancel_ack_lost"
        assert drop.fired == 1
        row = Operation.objects.get(id=op.id)
        assert row.state == State.CANCEL_REQUESTED
        assert not TerminalReceipt.objects.filter(operation=op).exists()
        wait_server_status(server, op.remote_id, {"cancelled"})
        Operation.objects.filter(id=op.id).update(lease_expires_at=timezone.now(),
                                                  next_poll_at=timezone.now())
        settle()  # polling learns "cancelled" from the server
        row.refresh_from_db()
        assert row.state == State.CANCELLED_ACCEPTED
    finally:
        late.release()
        poller.join(30)
    # The late completion never advances: an effect record beside the cancelled receipt.
    assert polled == ["late_effect"]
    row = Operation.objects.get(id=op.id)
    assert row.state == State.CANCELLED_ACCEPTED
    assert TerminalReceipt.objects.get(operation=op).terminal_status == "cancelled"
    assert EffectReconciliation.objects.filter(operation=op, observed_status="completed").count() == 1
    assert faults.methods.count("tasks/cancel") == 1  # the lost ack is never re-sent
    assert_invariants(mcp_url=mcp_url, ops=[op])
