"""Cancel and input flows THROUGH THE EXECUTOR (operation_cancel, operation_answer_input,
run_embedded) for Shape B (FastMCP + fastmcp-tasks peer) and the AIP-151 fake.

Both shapes only acknowledge a cancel ("cancel_ack_only"): the executor keeps the row
CANCEL_REQUESTED and polls until the server names the terminal state that won. Each case
asserts exactly one receipt per call node and the count of remote operations the peer made.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import pytest
from django.utils import timezone

from ledger.models import InputRequest, Operation, OperationEvent, TerminalReceipt, ToolServer
from ledger.selectors import operation_snapshot
from ledger.states import State
from tests.peers.launch_aip import aip_stats
from tests.peers.launch_ext import ext_peer_stats
from tests.toolops.fixtures_lifecycle import lifecycle_settle as _settle
from tests.toolops.fixtures_lifecycle import lifecycle_submit as _submit
from toolops.runner import run_embedded
from toolops.services.cancel import operation_cancel
from toolops.services.connections import (
    adapter_for_server,
    adapters_close_all,
    connections_use_transport,
)
from toolops.services.dispatch import operations_claim_due
from toolops.services.inputs import (
    InputAnswerRefused,
    operation_answer_input,
    operation_open_input_round,
)

pytestmark = pytest.mark.django_db

def _kinds(op: Operation) -> list[str]:
    return list(OperationEvent.objects.filter(operation=op).order_by("seq")
                .values_list("kind", flat=True))


def _one_receipt(op: Operation) -> dict[str, Any]:
    """Exactly one receipt and one outbox row for the call node; returns the snapshot."""
    assert TerminalReceipt.objects.filter(operation__call_node_id=op.call_node_id).count() == 1
    snap = operation_snapshot(operation_id=op.id)
    assert len(snap["outbox"]) == 1
    return snap


def _wait_remote(server: ToolServer, remote_id: str, wanted: set[str]) -> str:
    deadline = time.monotonic() + 15
    while True:
        status = adapter_for_server(server=server).get(remote_id=remote_id).status
        if status in wanted:
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.05)


def _ext_runs(url: str, tool: str) -> int:
    return int(ext_peer_stats(url)["runs"].get(tool, 0))


# -- Shape B: mcp-tasks-ext/2026-07-28 ---------------------------------------------------------


def _assert_cancelled_receipt(op: Operation, *, confirmed_by: str) -> None:
    snap = _one_receipt(op)
    assert snap["state"] == State.CANCELLED_ACCEPTED and snap["cancel_generation"] == 1
    assert snap["receipt"]["terminal_status"] == "cancelled"
    assert snap["receipt"]["payload"] is None
    assert snap["outbox"][0]["payload"]["payload"] is None
    kinds = [e["kind"] for e in snap["events"]]
    assert kinds.index("cancel_requested") < kinds.index("cancel_confirmed") < kinds.index("accepted")
    assert "result_fetched" not in kinds
    confirmed = [e for e in snap["events"] if e["kind"] == "cancel_confirmed"]
    assert [e["data"]["source"] for e in confirmed] == [confirmed_by]


def test_ext_cancel_wins_confirmed_by_the_read_after_the_ack(
    ext_server: ToolServer, ext_url: str
) -> None:
    """fastmcp-tasks applies the cancel before it acks, so the adapter's read after the ack
    already says `cancelled`: that read (not the ack) is the evidence."""
    runs = _ext_runs(ext_url, "sleep_then_complete")
    op = _submit(ext_server, "sleep_then_complete", "ext-cancel-wins", seconds=5, value="never")
    assert operation_cancel(operation_id=op.id) == "accepted:cancelled"
    _assert_cancelled_receipt(op, confirmed_by="cancel_reply")
    assert adapter_for_server(server=ext_server).get(remote_id=op.remote_id).status == "cancelled"
    assert _ext_runs(ext_url, "sleep_then_complete") - runs == 1


class _CancelLagTransport(httpx.BaseTransport):
    """Real HTTP to the peer; the first `tasks/get` after a `tasks/cancel` reads `working`, as
    a server whose cancellation takes effect after the ack reports it (SEP-2663: the cancel is
    only an acknowledgement). Every later read is the peer's own answer."""

    def __init__(self) -> None:
        self._inner = httpx.HTTPTransport()
        self._lag = False
        self.rewritten = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        method = json.loads(request.read() or b"{}").get("method")
        response = self._inner.handle_request(request)
        if method == "tasks/cancel":
            self._lag = True
        if method != "tasks/get" or not self._lag:
            return response
        self._lag = False
        body = response.read()
        lagged = re.sub(rb'"status":\s*"cancelled"', b'"status":"working"', body)
        self.rewritten += lagged != body
        headers = [(k, v) for k, v in response.headers.items()
                   if k.lower() not in ("content-length", "content-encoding")]
        response.close()
        return httpx.Response(response.status_code, headers=headers, content=lagged,
                              request=request)

    def close(self) -> None:
        self._inner.close()


def test_ext_cancel_ack_only_stays_requested_and_polls_until_cancelled(
    ext_server: ToolServer, ext_url: str
) -> None:
    runs = _ext_runs(ext_url, "sleep_then_complete")
    op = _submit(ext_server, "sleep_then_complete", "ext-cancel-ack", seconds=5, value="never")
    transport = _CancelLagTransport()
    connections_use_transport(lambda server: transport)
    try:
        assert operation_cancel(operation_id=op.id) == "cancel_reply_not_cancelled"
        assert transport.rewritten == 1
        row = Operation.objects.get(id=op.id)
        # The ack is no evidence: the row waits, due for a poll, with no receipt.
        assert row.state == State.CANCEL_REQUESTED and row.next_poll_at is not None
        assert row.lease_owner in (None, "")
        assert TerminalReceipt.objects.filter(operation=op).count() == 0
        _settle()
    finally:
        connections_use_transport(None)
    _assert_cancelled_receipt(op, confirmed_by="poll")
    assert _ext_runs(ext_url, "sleep_then_complete") - runs == 1


def test_ext_completion_wins_the_receipt_stays_completed(
    ext_server: ToolServer, ext_url: str
) -> None:
    runs = _ext_runs(ext_url, "sleep_then_complete")
    op = _submit(ext_server, "sleep_then_complete", "ext-completion-wins", seconds=0.05, value="won")
    _wait_remote(ext_server, op.remote_id, {"completed"})  # our poller has not seen it yet
    outcome = operation_cancel(operation_id=op.id)
    assert outcome in {"accepted:completed", "cancel_reply_not_cancelled"}, outcome
    _settle()
    snap = _one_receipt(op)
    assert snap["state"] == State.ACCEPTED
    assert snap["receipt"]["terminal_status"] == "completed"
    assert snap["receipt"]["payload"]["payload"]["content"][0]["text"] == "won"
    kinds = [e["kind"] for e in snap["events"]]
    assert "cancel_lost" in kinds and "cancel_confirmed" not in kinds
    assert kinds.index("result_fetched") < kinds.index("accepted")
    # Never rewritten: the server and the ledger both still say completed.
    assert adapter_for_server(server=ext_server).get(remote_id=op.remote_id).status == "completed"
    assert TerminalReceipt.objects.get(operation=op).terminal_status == "completed"
    assert _ext_runs(ext_url, "sleep_then_complete") - runs == 1


def test_ext_input_round_answered_then_completed(ext_server: ToolServer, ext_url: str) -> None:
    runs = _ext_runs(ext_url, "ask_input")
    op = _submit(ext_server, "ask_input", "ext-input-answered", question="Name?")
    deadline = time.monotonic() + 15
    while Operation.objects.get(id=op.id).state != State.INPUT_REQUIRED:
        assert time.monotonic() < deadline
        run_embedded(until_idle=True, max_seconds=1)
    op.refresh_from_db()
    assert op.input_round == 1 and op.next_poll_at is None
    ir = InputRequest.objects.get(operation=op, round=1)
    # Opened from the inline `inputRequests` of tasks/get, keyed by the server's own key
    # (fastmcp-tasks namespaces the tool's "name" key per leg).
    live = adapter_for_server(server=ext_server).get(remote_id=op.remote_id)
    assert [f'"{r.request_id}"' for r in live.input_requests] == [ir.server_request_id]
    assert ir.method == "elicitation/create"
    assert ir.params["message"] == "Name?" and ir.status == InputRequest.Status.OPEN

    assert operation_answer_input(operation_id=op.id, input_round=1,
                                  schema_digest=ir.schema_digest,
                                  response={"name": "Ada"}) == "delivered"
    op.refresh_from_db()
    assert op.state == State.WORKING and op.next_poll_at is not None
    _settle()
    snap = _one_receipt(op)
    assert snap["state"] == State.ACCEPTED
    assert snap["receipt"]["terminal_status"] == "completed"
    assert snap["receipt"]["payload"]["payload"]["content"][0]["text"] == "Hello, Ada!"
    assert InputRequest.objects.filter(operation=op).count() == 1
    kinds = _kinds(op)
    assert kinds.count("input_round_opened") == 1 and kinds.count("input_delivered") == 1
    # One task; the extension re-runs the body once per input leg.
    assert _ext_runs(ext_url, "ask_input") - runs == 2


def test_ext_replayed_input_key_opens_no_new_round(ext_server: ToolServer) -> None:
    """The extension repeats `inputRequests` on every read until it processes the answer; a
    worker that reads the same key again (a fresh process: no adapter memory) opens nothing."""
    op = _submit(ext_server, "ask_input", "ext-input-replay", question="Name?")
    deadline = time.monotonic() + 15
    while Operation.objects.get(id=op.id).state != State.INPUT_REQUIRED:
        assert time.monotonic() < deadline
        run_embedded(until_idle=True, max_seconds=1)
    seen = adapter_for_server(server=ext_server).get(remote_id=op.remote_id)
    assert seen.status == "input_required" and len(seen.input_requests) == 1
    key = f'"{seen.input_requests[0].request_id}"'
    # A second worker holding an older `input_required` observation of the still-WORKING row
    # (the same shape as test_inputs' replay case): its read returns the key again.
    Operation.objects.filter(id=op.id).update(state=State.WORKING, next_poll_at=timezone.now())
    assert operations_claim_due(owner="replay") == [op.id]
    adapters_close_all()
    op.refresh_from_db()
    outcome = operation_open_input_round(op=op, lease_owner="replay", task=seen, fields={},
                                         data={"status": "input_required"})
    assert outcome == "input_required_replayed"
    replay = OperationEvent.objects.filter(operation=op, kind="input_required_no_new_round").get()
    assert replay.data["requests_seen"] == [key]  # the key was read, and deduplicated
    assert InputRequest.objects.filter(operation=op).count() == 1
    # Back to the paused row, then the real answer: still one round, one receipt.
    Operation.objects.filter(id=op.id).update(state=State.INPUT_REQUIRED, next_poll_at=None)
    ir = InputRequest.objects.get(operation=op, round=1)
    assert operation_answer_input(operation_id=op.id, input_round=1,
                                  schema_digest=ir.schema_digest,
                                  response={"name": "Bob"}) == "delivered"
    _settle()
    snap = _one_receipt(op)
    assert snap["receipt"]["payload"]["payload"]["content"][0]["text"] == "Hello, Bob!"
    assert InputRequest.objects.filter(operation=op).count() == 1


# -- aip-151/v1 ---------------------------------------------------------------------------------


def _aip_counts(aip_url: str, before: dict[str, int]) -> tuple[int, int]:
    after = aip_stats(aip_url)["counters"]
    return (after.get("created", 0) - before.get("created", 0),
            after.get("cancel", 0) - before.get("cancel", 0))


@pytest.mark.parametrize(("delay_s", "first_outcome", "confirmed_by"), [
    (0.0, "accepted:cancelled", "cancel_reply"),  # the Get after the ack already says done/1
    (0.3, "cancel_reply_not_cancelled", "poll"),  # the cancel lands later: the row waits
])
def test_aip_cancel_wins_done_with_code_1_is_cancelled(
    aip_server: ToolServer, aip_url: str, delay_s: float, first_outcome: str, confirmed_by: str
) -> None:
    before = aip_stats(aip_url)["counters"]
    op = _submit(aip_server, "render", f"aip-cancel-wins-{delay_s}", seconds=5, value="never",
                 cancelDelaySeconds=delay_s)
    assert operation_cancel(operation_id=op.id) == first_outcome
    if confirmed_by == "poll":
        row = Operation.objects.get(id=op.id)
        assert row.state == State.CANCEL_REQUESTED and row.next_poll_at is not None
        assert TerminalReceipt.objects.filter(operation=op).count() == 0
    _settle()
    _assert_cancelled_receipt(op, confirmed_by=confirmed_by)
    remote = adapter_for_server(server=aip_server).get(remote_id=op.remote_id)
    assert remote.status == "cancelled" and remote.raw["error"]["code"] == 1
    assert _aip_counts(aip_url, before) == (1, 1)


@pytest.mark.parametrize("when", ["racing", "after_done"])
def test_aip_completion_wins_the_receipt_stays_completed(
    aip_server: ToolServer, aip_url: str, when: str
) -> None:
    """racing: the fake acks the cancel and the work finishes anyway (cancelLoses);
    after_done: the operation is done before the cancel is sent (a harmless no-op)."""
    before = aip_stats(aip_url)["counters"]
    if when == "racing":
        op = _submit(aip_server, "render", "aip-completion-racing", seconds=0.5, value="won",
                     cancelLoses=True)
    else:
        op = _submit(aip_server, "render", "aip-completion-after", seconds=0.05, value="won")
        _wait_remote(aip_server, op.remote_id, {"completed"})  # our poller has not seen it
    outcome = operation_cancel(operation_id=op.id)
    assert outcome == "cancel_reply_not_cancelled", outcome  # an ack is never the outcome
    assert Operation.objects.get(id=op.id).state == State.CANCEL_REQUESTED
    _settle()
    snap = _one_receipt(op)
    assert snap["state"] == State.ACCEPTED
    assert snap["receipt"]["terminal_status"] == "completed"
    assert snap["receipt"]["payload"]["payload"]["value"] == "won"
    kinds = [e["kind"] for e in snap["events"]]
    assert "cancel_lost" in kinds and "cancel_confirmed" not in kinds
    assert kinds.index("result_fetched") < kinds.index("accepted")
    assert adapter_for_server(server=aip_server).get(remote_id=op.remote_id).status == "completed"
    assert _aip_counts(aip_url, before) == (1, 1)


def test_aip_has_no_input_answer_is_refused_and_no_round_opens(
    aip_server: ToolServer, aip_url: str
) -> None:
    before = aip_stats(aip_url)["counters"]
    op = _submit(aip_server, "render", "aip-no-input", seconds=0.3, value="v")
    with pytest.raises(InputAnswerRefused, match="aip-151/v1, whose operations take no input"):
        operation_answer_input(operation_id=op.id, input_round=1, schema_digest="sha256:x",
                               response={"name": "Ada"})
    assert "input_answer_refused" in _kinds(op)
    _settle()
    snap = _one_receipt(op)
    assert snap["receipt"]["terminal_status"] == "completed"
    assert InputRequest.objects.filter(operation=op).count() == 0
    kinds = [e["kind"] for e in snap["events"]]
    assert "input_round_opened" not in kinds
    assert _aip_counts(aip_url, before) == (1, 0)  # one operation, no cancel
