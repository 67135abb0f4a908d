"""Cancel as a request, against the reference SDK server over real HTTP."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.core.management import call_command
from django.utils import timezone

from adapters import McpTasks2025Adapter
from ledger.models import (
    EffectReconciliation,
    Operation,
    OperationEvent,
    OutboxEvent,
    TerminalReceipt,
    ToolServer,
)
from ledger.selectors import operation_snapshot
from ledger.states import State
from tests.concurrency import race_at_once
from tests.toolops.helpers import submit_tool_call
from toolops.runner import run_embedded
from toolops.services import connections as connections_service
from toolops.services.cancel import CancelRefused, operation_cancel
from toolops.services.connections import adapter_for_server
from toolops.services.dispatch import operations_claim_due
from toolops.services.observe import operation_poll

pytestmark = pytest.mark.django_db


def _server_status(server: ToolServer, remote_id: str) -> str:
    return adapter_for_server(server=server).get(remote_id=remote_id).status


def _wait_server_status(server: ToolServer, remote_id: str, wanted: set[str]) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = _server_status(server, remote_id)
        if status in wanted:
            return status
        time.sleep(0.05)
    raise AssertionError(f"task {remote_id} never reached {wanted}")


def _kinds(op: Operation) -> list[str]:
    return list(OperationEvent.objects.filter(operation=op).order_by("seq")
                .values_list("kind", flat=True))


def _accepted_data(op: Operation) -> dict[str, Any]:
    return OperationEvent.objects.get(operation=op, kind="accepted").data


class _FaultTransport(httpx.BaseTransport):
    """A real HTTP transport with one fault: for requests whose JSON-RPC method is `method`, the
    request reaches the server and is answered, then `on_response` decides what we get."""

    def __init__(self, *, method: str,
                 on_response: Callable[[httpx.Request, httpx.Response], httpx.Response],
                 before_send: Callable[[], None] | None = None) -> None:
        self._inner = httpx.HTTPTransport()
        self._method = method
        self._on_response = on_response
        self._before_send = before_send
        self.hits = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        if b'"method":"' + self._method.encode() + b'"' not in body.replace(b" ", b""):
            return self._inner.handle_request(request)
        self.hits += 1
        if self._before_send is not None:
            before, self._before_send = self._before_send, None
            before()
        response = self._inner.handle_request(request)
        response.read()
        response.close()
        return self._on_response(request, response)

    def close(self) -> None:
        self._inner.close()


def _drop(request: httpx.Request, response: httpx.Response) -> httpx.Response:
    # The server has processed the request and answered; the answer never reaches us.
    raise httpx.ReadTimeout("response dropped after the request was sent", request=request)


def _faulty_adapter(server: ToolServer, transport: httpx.BaseTransport) -> McpTasks2025Adapter:
    return McpTasks2025Adapter(url=server.url, session_id=server.session_id, transport=transport)


def test_cancel_wins_receipt_is_cancelled_without_success_payload(server: ToolServer) -> None:
    op = submit_tool_call(server, "sleep_then_complete", "c-wins", seconds=5, value="never")
    assert operation_cancel(operation_id=op.id) == "accepted:cancelled"
    snap = operation_snapshot(operation_id=op.id)
    assert snap["state"] == State.CANCELLED_ACCEPTED
    assert snap["cancel_generation"] == 1
    assert snap["receipt"]["terminal_status"] == "cancelled"
    assert snap["receipt"]["payload"] is None
    # mcp 1.30 still answers tasks/result after cancel: it joins the audit record only.
    assert snap["receipt"]["audit"]["late_result"]["confirmed_by"] == "cancel_reply"
    assert len(snap["outbox"]) == 1 and snap["outbox"][0]["payload"]["payload"] is None
    kinds = [e["kind"] for e in snap["events"]]
    assert kinds.index("cancel_requested") < kinds.index("cancel_confirmed") < kinds.index("accepted")
    data = _accepted_data(op)
    assert data["cancel_outcome"] == "won" and data["cancel_confirmation_ms"] > 0
    assert _server_status(server, op.remote_id) == "cancelled"


def test_completion_wins_the_race_and_the_cancel_is_recorded_as_lost(server: ToolServer) -> None:
    op = submit_tool_call(server, "sleep_then_complete", "c-lost", seconds=0.05, value="won")
    _wait_server_status(server, op.remote_id, {"completed"})  # our poller has not seen it yet
    assert operation_cancel(operation_id=op.id) == "accepted:completed"
    op.refresh_from_db()
    assert op.state == State.ACCEPTED and op.terminal_status == "completed"
    receipt = TerminalReceipt.objects.get(operation=op)
    assert receipt.terminal_status == "completed"
    assert receipt.payload is not None and receipt.payload["payload"]["content"][0]["text"] == "won"
    kinds = _kinds(op)
    assert "cancel_already_terminal" in kinds and "cancel_lost" in kinds
    assert _accepted_data(op)["cancel_outcome"] == "lost"
    assert _server_status(server, op.remote_id) == "completed"  # never rewritten to cancelled


def test_cancel_ack_lost_keeps_polling_until_the_server_says_cancelled(
    server: ToolServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    op = submit_tool_call(server, "sleep_then_complete", "c-ack-lost", seconds=5, value="never")
    transport = _FaultTransport(method="tasks/cancel", on_response=_drop)
    faulty = _faulty_adapter(server, transport)
    monkeypatch.setattr(connections_service, "adapter_for_server", lambda server: faulty)
    try:
        assert operation_cancel(operation_id=op.id) == "cancel_ack_lost"
    finally:
        monkeypatch.undo()
        faulty.close()
    assert transport.hits == 1
    op.refresh_from_db()
    assert op.state == State.CANCEL_REQUESTED and op.lease_owner == ""
    assert not TerminalReceipt.objects.filter(operation=op).exists()
    assert op.next_poll_at is not None
    assert op.next_poll_at <= timezone.now() + timedelta(seconds=2)  # the server's pace, not later
    # The server did cancel; polling finds that out and accepts it.
    run_embedded(until_idle=True, max_seconds=15)
    op.refresh_from_db()
    assert op.state == State.CANCELLED_ACCEPTED
    assert TerminalReceipt.objects.get(operation=op).terminal_status == "cancelled"
    confirmed = OperationEvent.objects.get(operation=op, kind="cancel_confirmed")
    assert confirmed.data["source"] == "poll"
    assert _kinds(op).index("cancel_ack_lost") < _kinds(op).index("cancel_confirmed")


class _RefusingTransport(httpx.BaseTransport):
    """Connection refused for the first `tasks/cancel`: provably never reached the server."""

    def __init__(self) -> None:
        self._inner = httpx.HTTPTransport()
        self.refused = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if b"tasks/cancel" in request.read() and self.refused == 0:
            self.refused += 1
            raise httpx.ConnectError("connection refused", request=request)
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


def test_unsent_cancel_is_sent_again_by_the_poller_even_during_input_required(
    server: ToolServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    op = submit_tool_call(server, "ask_input", "c-unsent", question="q?")
    run_embedded(until_idle=True, max_seconds=15)
    op.refresh_from_db()
    assert op.state == State.INPUT_REQUIRED
    transport = _RefusingTransport()
    flaky = _faulty_adapter(server, transport)
    monkeypatch.setattr(connections_service, "adapter_for_server", lambda server: flaky)
    try:
        assert operation_cancel(operation_id=op.id) == "cancel_not_sent"
        assert _server_status(server, op.remote_id) == "input_required"
        # The poller sees input_required, keeps polling (no pause while a cancel is pending) and
        # sends the cancel again under the same generation.
        run_embedded(until_idle=True, max_seconds=15)
    finally:
        flaky.close()
    op.refresh_from_db()
    assert op.state == State.CANCELLED_ACCEPTED and op.cancel_generation == 1
    assert transport.refused == 1
    observed = OperationEvent.objects.filter(operation=op, kind="observed",
                                             from_state=State.CANCEL_REQUESTED).first()
    assert observed is not None and observed.data["cancel_resend"] is True
    assert _server_status(server, op.remote_id) == "cancelled"


def _rewrite_cancelled_to_completed(request: httpx.Request, response: httpx.Response
                                    ) -> httpx.Response:
    body = response.content.replace(b'"status":"cancelled"', b'"status":"completed"')
    headers = [(k, v) for k, v in response.headers.items() if k.lower() != "content-length"]
    return httpx.Response(response.status_code, headers=headers, content=body, request=request)


def test_late_completion_after_accepted_cancel_creates_an_effect_record_only(
    server: ToolServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stale worker's `tasks/get` is in flight when the cancel is accepted, and it reports a
    completion (what a server whose work outlives the cancel reports: mcp-tasks.md section 4; the
    reference peer stops the work, so the transport turns its real reply into that completion)."""
    op = submit_tool_call(server, "sleep_then_complete", "c-late", seconds=5, value="late")
    Operation.objects.filter(id=op.id).update(next_poll_at=timezone.now())
    assert operations_claim_due(owner="stale-worker") == [op.id]
    transport = _FaultTransport(
        method="tasks/get", on_response=_rewrite_cancelled_to_completed,
        before_send=lambda: operation_cancel(operation_id=op.id),
    )
    stale = _faulty_adapter(server, transport)
    monkeypatch.setattr(connections_service, "adapter_for_server", lambda server: stale)
    try:
        outcome = operation_poll(operation_id=op.id, lease_owner="stale-worker")
    finally:
        stale.close()
    assert outcome == "late_effect"
    snap = operation_snapshot(operation_id=op.id)
    assert snap["state"] == State.CANCELLED_ACCEPTED  # nothing advanced
    assert snap["receipt"]["terminal_status"] == "cancelled" and snap["receipt"]["payload"] is None
    assert len(snap["outbox"]) == 1
    [effect] = snap["effect_reconciliations"]
    assert effect["observed_status"] == "completed" and effect["source"] == "poll"
    assert snap["events"][-1]["kind"] == "effect_reconciliation_required"


def test_stale_cancelled_observation_after_accepted_cancel_is_no_effect(
    server: ToolServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    op = submit_tool_call(server, "sleep_then_complete", "c-stale", seconds=5, value="x")
    Operation.objects.filter(id=op.id).update(next_poll_at=timezone.now())
    assert operations_claim_due(owner="stale-worker") == [op.id]
    transport = _FaultTransport(method="tasks/get", on_response=lambda req, resp: httpx.Response(
        resp.status_code, headers=[(k, v) for k, v in resp.headers.items()
                                   if k.lower() != "content-length"],
        content=resp.content, request=req),
        before_send=lambda: operation_cancel(operation_id=op.id))
    stale = _faulty_adapter(server, transport)
    monkeypatch.setattr(connections_service, "adapter_for_server", lambda server: stale)
    try:
        assert operation_poll(operation_id=op.id, lease_owner="stale-worker") == "stale_observation"
    finally:
        stale.close()
    assert not EffectReconciliation.objects.filter(operation=op).exists()


def test_cancel_of_a_finished_operation_is_refused_and_recorded(server: ToolServer) -> None:
    op = submit_tool_call(server, "sleep_then_complete", "c-done", seconds=0.05, value="v")
    run_embedded(until_idle=True, max_seconds=15)
    with pytest.raises(CancelRefused, match="is ACCEPTED"):
        operation_cancel(operation_id=op.id)
    op.refresh_from_db()
    assert op.state == State.ACCEPTED and op.cancel_generation == 0
    assert OperationEvent.objects.get(operation=op, kind="cancel_refused").data["reason"] == (
        "state ACCEPTED")


def test_second_cancel_while_requested_is_refused(server: ToolServer,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    op = submit_tool_call(server, "sleep_then_complete", "c-twice", seconds=5, value="v")
    faulty = _faulty_adapter(server, _FaultTransport(method="tasks/cancel", on_response=_drop))
    monkeypatch.setattr(connections_service, "adapter_for_server", lambda server: faulty)
    assert operation_cancel(operation_id=op.id) == "cancel_ack_lost"
    with pytest.raises(CancelRefused, match="cancel already requested"):
        operation_cancel(operation_id=op.id)
    faulty.close()
    op.refresh_from_db()
    assert op.cancel_generation == 1 and op.state == State.CANCEL_REQUESTED


def test_wait_budget_running_out_never_sends_a_cancel(server: ToolServer) -> None:
    op = submit_tool_call(server, "sleep_then_complete", "c-budget", seconds=5, value="v")
    Operation.objects.filter(id=op.id).update(expires_at=timezone.now() - timedelta(seconds=1),
                                              next_poll_at=timezone.now())
    run_embedded(until_idle=True, max_seconds=10)
    op.refresh_from_db()
    assert op.state == State.RECONCILIATION_REQUIRED and op.cancel_generation == 0
    assert "cancel_requested" not in _kinds(op)
    assert _server_status(server, op.remote_id) == "working"  # the server was never told to stop


def test_cancel_from_input_required_withdraws_the_open_round(server: ToolServer) -> None:
    op = submit_tool_call(server, "ask_input", "c-input", question="colour?")
    run_embedded(until_idle=True, max_seconds=15)
    op.refresh_from_db()
    assert op.state == State.INPUT_REQUIRED
    assert operation_cancel(operation_id=op.id) == "accepted:cancelled"
    snap = operation_snapshot(operation_id=op.id)
    assert snap["state"] == State.CANCELLED_ACCEPTED
    assert [r["status"] for r in snap["input_requests"]] == ["withdrawn"]


def test_cancel_command_prints_the_operation(server: ToolServer) -> None:
    op = submit_tool_call(server, "sleep_then_complete", "c-cli", seconds=5, value="v")
    out = io.StringIO()
    call_command("toolops", "cancel", op.remote_id, stdout=out)
    shown = json.loads(out.getvalue())
    assert shown["id"] == str(op.id) and shown["state"] == State.CANCELLED_ACCEPTED
    assert shown["receipt"]["terminal_status"] == "cancelled"
    assert OutboxEvent.objects.filter(receipt__operation=op).count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_cancels_bump_the_generation_once(server: ToolServer) -> None:
    op = submit_tool_call(server, "sleep_then_complete", "c-race", seconds=5, value="v")
    def cancel() -> str:
        try:
            return operation_cancel(operation_id=op.id)
        except CancelRefused as exc:
            return f"refused:{exc}"

    outcomes, errors = race_at_once(4, cancel)
    assert not errors, errors
    assert sorted(o.split(":")[0] for o in outcomes) == ["accepted", "refused", "refused", "refused"]
    op.refresh_from_db()
    assert op.state == State.CANCELLED_ACCEPTED and op.cancel_generation == 1
    assert TerminalReceipt.objects.filter(operation=op).count() == 1
    assert OperationEvent.objects.filter(operation=op, kind="cancel_requested").count() == 1
