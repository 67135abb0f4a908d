"""An operator's day in the web UI, in a real browser against the server as deployed."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.utils import timezone
from playwright.sync_api import expect

from ledger.models import (
    InputRequest,
    Operation,
    OperationEvent,
    OutboxEvent,
    ReconciliationItem,
    TerminalReceipt,
    ToolServer,
)
from ledger.states import State
from tests.ledger.factories import OperationFactory, ToolServerFactory
from tests.toolops.browser.conftest import assert_clean, login, shot
from toolops.runner import run_embedded
from toolops.services.operators import operator_bootstrap
from toolops.services.reconcile import operation_to_reconciliation
from toolops.services.servers import server_add
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct horse battery"


@pytest.fixture
def operator() -> str:
    return operator_bootstrap(username="ana", email="ana@example.com", password=PASSWORD,
                              organisation="acme").username


def _stuck(remote_id: str, **fields: Any) -> ReconciliationItem:
    op = OperationFactory(remote_id=remote_id, **fields)
    return operation_to_reconciliation(op=op, lease_owner=None, reason="not_found_unknown",
                                       evidence={"classification": "UNKNOWN", "status": 404})


def test_find_a_stuck_operation_by_remote_id_prefix_and_resolve_it(page: Any, operator: str) -> None:
    stuck = _stuck("task-7f3a9c-render-4411")
    _stuck("task-0b1e22-render-9000")  # another open item the search must leave out
    login(page, username=operator, password=PASSWORD)
    # Styles are served (WhiteNoise) with DEBUG off: the admin header is laid out by its CSS.
    assert page.evaluate("getComputedStyle(document.querySelector('#header')).display") == "flex"

    page.goto("/admin/ledger/reconciliationitem/?queue=open")
    assert "remote id or call node (prefix)" in page.inner_text("#changelist-search")
    page.fill("#searchbar", "task-7f3a")
    page.press("#searchbar", "Enter")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(1)
    for column in ("server", "tool", "deadline", "owner", "outcome", "age", "call node"):
        assert page.locator(f"#result_list thead th:has-text('{column}')").count() == 1, column
    # Every column fits at 1400 px: no horizontal scroll.
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400
    shot(page, "reconciliation-list")

    rows.first.locator("th a").click()
    page.click("text=Accept terminal state…")
    # Refused by the service (no result was fetched and no evidence given): the page says why and
    # keeps the reason typed.
    page.fill("#id_reason", "server console shows the render finished at 12:04")
    page.select_option("#id_terminal_status", "completed")
    page.click("#resolve_form input[type=submit]")
    assert "the evidence must carry what was seen" in page.inner_text(".errornote")
    assert page.input_value("#id_reason") == "server console shows the render finished at 12:04"
    page.fill("#id_evidence", '{"content": [{"type": "text", "text": "render 4411 done"}]}')
    shot(page, "reconciliation-resolve")
    page.click("#resolve_form input[type=submit]")
    assert "1 item(s) resolved" in page.inner_text(".messagelist")

    stuck.refresh_from_db()
    assert stuck.status == "resolved" and stuck.resolved_by == "ana"
    op = Operation.objects.get(id=stuck.operation_id)
    assert op.state == State.ACCEPTED
    assert LogEntry.objects.filter(object_id=str(stuck.pk), user__username="ana").exists()
    assert LogEntry.objects.filter(object_id=str(op.pk), user__username="ana").exists()

    page.click("text=Operation timeline")
    shown = page.inner_text(".field-server_state_display")
    assert "not observed: completed attested by ana" in shown
    assert "accept_terminal by ana" in page.inner_text("#related")
    assert_clean(page)


def _long_operation(events: int) -> Operation:
    op = OperationFactory(remote_id="task-long-0001", state=State.ACCEPTED, server_state="completed",
                          terminal_status="completed", result_kind="result", result_digest="sha256:r",
                          call_node_id="plan-7/step-3", tool_name="deep_research",
                          result={"kind": "result", "is_error": False,
                                  "payload": {"content": [{"type": "text", "text": "tides"}]}})
    receipt = TerminalReceipt.objects.create(
        operation=op, call_node_id=op.call_node_id, execution_epoch=1, terminal_status="completed",
        request_digest=op.request_digest, remote_id=op.remote_id,
        descriptor_version=op.descriptor_version, cancel_generation=0, result_digest="sha256:r",
        payload=op.result)
    OutboxEvent.objects.create(receipt=receipt, payload={"receipt_id": receipt.pk})
    start = timezone.now() - timedelta(seconds=events)
    rows = [OperationEvent(operation=op, seq=1, kind="created", to_state=State.SUBMITTING,
                           execution_epoch=1, cancel_generation=0),
            OperationEvent(operation=op, seq=2, kind="submitted", from_state=State.SUBMITTING,
                           to_state=State.WORKING, server_state="working", execution_epoch=1,
                           cancel_generation=0, data={"taskId": "task-long-0001"})]
    for seq in range(3, events - 1):
        rows.append(OperationEvent(operation=op, seq=seq, kind="observed", from_state=State.WORKING,
                                   to_state=State.WORKING, server_state="working", execution_epoch=1,
                                   cancel_generation=0, data={"pollInterval": 1000}))
    rows.append(OperationEvent(operation=op, seq=events - 1, kind="terminal_observed",
                               from_state=State.WORKING, to_state=State.TERMINAL_OBSERVED,
                               server_state="completed", execution_epoch=1, cancel_generation=0))
    rows.append(OperationEvent(operation=op, seq=events, kind="accepted",
                               from_state=State.FETCHING_RESULT, to_state=State.ACCEPTED,
                               server_state="completed", execution_epoch=1, cancel_generation=0,
                               data={"receipt_id": receipt.pk}))
    OperationEvent.objects.bulk_create(rows)
    for event in OperationEvent.objects.filter(operation=op):
        OperationEvent.objects.filter(pk=event.pk).update(
            created_at=start + timedelta(seconds=event.seq, milliseconds=250))
    return op


def test_a_long_timeline_reads_as_a_few_lines(page: Any, operator: str) -> None:
    op = _long_operation(146)
    login(page, username=operator, password=PASSWORD)
    page.goto("/admin/ledger/operation/")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400
    page.fill("#searchbar", "task-long")
    page.press("#searchbar", "Enter")
    page.locator("#result_list tbody tr th a").first.click()
    timeline = page.locator("table.toolops-timeline tbody tr")
    expect(timeline).to_have_count(5)  # created, submitted, 142 polls folded, terminal, accepted
    folded = page.inner_text("table.toolops-timeline tr.folded")
    assert "142 \N{MULTIPLICATION SIGN} observed" in folded
    expect(page.locator("table.toolops-timeline tr.state-change")).to_have_count(4)
    # Times to the second.
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", page.inner_text("table.toolops-timeline"))
    assert page.evaluate("document.documentElement.scrollHeight") < 4000
    for link in ("Receipt:", "Outbox:", "Reconciliation:", "Input rounds:", "Effect reconciliations:"):
        assert link in page.inner_text("#related")
    page.locator("#related a", has_text="completed").wait_for()
    assert "not published yet" in page.inner_text("#related")
    shot(page, "operation-timeline", full_page=True)
    assert str(op.id) in page.inner_text(".field-id")
    assert_clean(page)


def test_a_timeline_with_many_state_changes_is_paged(page: Any, operator: str) -> None:
    op = OperationFactory(remote_id="task-flappy", state=State.WORKING)
    OperationEvent.objects.bulk_create([
        OperationEvent(operation=op, seq=seq, kind="observed",
                       from_state=State.WORKING if seq % 2 else State.INPUT_REQUIRED,
                       to_state=State.INPUT_REQUIRED if seq % 2 else State.WORKING,
                       server_state="working", execution_epoch=1, cancel_generation=0)
        for seq in range(1, 121)])
    login(page, username=operator, password=PASSWORD)
    page.goto(f"/admin/ledger/operation/{op.id}/change/")
    assert "Timeline page 1 of 3" in page.inner_text(".toolops-paginator")
    expect(page.locator("table.toolops-timeline tbody tr")).to_have_count(50)
    page.locator(".toolops-paginator >> text=last").first.click()
    assert "Timeline page 3 of 3" in page.inner_text(".toolops-paginator")
    expect(page.locator("table.toolops-timeline tbody tr")).to_have_count(20)
    assert_clean(page)


@pytest.fixture
def waiting_rounds(mcp_url: str) -> list[Operation]:
    server = server_add(name="ref", url=mcp_url)
    ops = [operation_submit(server_name=server.name, tool_name="ask_input", call_node_id=node,
                            arguments={"question": question}, ttl_ms=120_000)
           for node, question in (("plan-1/colour", "Which colour?"), ("plan-1/size", "Which size?"))]
    run_embedded(until_idle=True, max_seconds=20)
    for op in ops:
        op.refresh_from_db()
        assert op.state == State.INPUT_REQUIRED
    return ops


def test_answer_one_input_round_and_decline_another_with_confirmation(
    page: Any, operator: str, waiting_rounds: list[Operation],
) -> None:
    colour, size = waiting_rounds
    login(page, username=operator, password=PASSWORD)
    page.goto("/admin/ledger/inputrequest/")
    expect(page.locator("#result_list tbody tr")).to_have_count(2)
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400
    shot(page, "input-requests")
    page.locator("#result_list tbody tr", has_text="Which colour?").locator("text=answer").click()
    page.fill("#id_content", '{"value": "red"')  # a typo: the form keeps it and says why
    page.click("#answer_form input[type=submit]")
    assert "not valid JSON" in page.inner_text("#answer_form")
    assert page.input_value("#id_content") == '{"value": "red"'
    page.fill("#id_content", '{"value": "red"}')
    page.click("#answer_form input[type=submit]")
    assert "answered (accept)" in page.inner_text(".messagelist")

    page.locator("#result_list tbody tr", has_text="Which size?").locator("text=answer").click()
    page.select_option("#id_action", "decline")
    page.click("#answer_form input[type=submit]")
    assert "Decline input round 1?" in page.inner_text("#content")  # asked first, nothing sent yet
    assert InputRequest.objects.get(operation=size).status == InputRequest.Status.OPEN
    shot(page, "input-decline-confirm")
    page.click("input[value='Yes, decline']")
    assert "answered (decline)" in page.inner_text(".messagelist")

    answered = InputRequest.objects.select_related("answered_by").get(operation=colour)
    declined = InputRequest.objects.select_related("answered_by").get(operation=size)
    assert answered.answer == {"action": "accept", "content": {"value": "red"}}
    assert declined.answer == {"action": "decline"}
    assert answered.answered_by.username == declined.answered_by.username == "ana"
    assert LogEntry.objects.filter(object_id=str(declined.pk), user__username="ana").exists()

    # The timeline names the answerer by user name.
    page.goto(f"/admin/ledger/operation/{colour.id}/change/")
    row = page.locator("table.toolops-timeline tr", has_text="input_answered")
    row.locator("summary").click()
    assert '"answered_by": "ana"' in row.inner_text()
    assert_clean(page)


def test_a_view_only_operator_is_offered_no_answer_or_resolve(
    page: Any, waiting_rounds: list[Operation],
) -> None:
    from django.contrib.auth.models import Permission, User

    viewer = User.objects.create_user("vic", password=PASSWORD, is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename__in=[
        "view_inputrequest", "view_reconciliationitem", "view_operation"]))
    item = _stuck("task-viewonly", server=ToolServer.objects.get(name="ref"))
    login(page, username="vic", password=PASSWORD)
    page.goto("/admin/ledger/inputrequest/")
    expect(page.locator("#result_list tbody tr")).to_have_count(2)
    expect(page.locator("#result_list a", has_text="answer")).to_have_count(0)
    page.goto(f"/admin/ledger/reconciliationitem/{item.pk}/change/")
    expect(page.locator("text=Resolve this item")).to_have_count(0)
    page.goto(f"/admin/ledger/operation/{item.operation_id}/change/")
    expect(page.locator("text=Cancel operation")).to_have_count(0)
    assert_clean(page)


def test_swagger_ui_tries_a_request_and_redoc_loads_offline(page: Any, operator: str) -> None:
    ToolServerFactory(name="search")  # shared (no tenant): the operator's organisation sees it
    login(page, username=operator, password=PASSWORD)
    page.goto("/api/docs/")
    block = page.locator(".opblock", has_text="/api/servers/").first
    block.locator(".opblock-summary").first.click()
    block.locator("button.try-out__btn").click()
    block.locator("button.execute").click()
    status = block.locator(".live-responses-table tr.response .response-col_status").first
    expect(status).to_have_text("200")
    assert '"name": "search"' in block.locator(".live-responses-table .microlight").first.inner_text()
    shot(page, "swagger-try")
    page.goto("/api/redoc/")
    page.locator("h1", has_text="toolops API").wait_for()
    page.wait_for_load_state("networkidle")
    assert_clean(page)
