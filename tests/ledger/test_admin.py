"""Receipts in admin tell what "completed" hides: server, tool, isError, a declined input round."""

from __future__ import annotations

import warnings

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from ledger.models import InputRequest, TerminalReceipt
from ledger.states import State
from tests.ledger.factories import OperationFactory, ToolServerFactory

pytestmark = pytest.mark.django_db


def _receipt(*, is_error: bool, declined: bool) -> TerminalReceipt:
    op = OperationFactory(state=State.ACCEPTED, tool_name="render")
    if declined:
        InputRequest.objects.create(operation=op, round=1, server_request_id="1",
                                    method="elicitation/create", params={}, schema_digest="d",
                                    deadline=timezone.now(), status="answered",
                                    answer={"action": "decline"})
    return TerminalReceipt.objects.create(
        operation=op, call_node_id=op.call_node_id, execution_epoch=1, terminal_status="completed",
        request_digest=op.request_digest, remote_id=op.remote_id,
        descriptor_version=op.descriptor_version, cancel_generation=0,
        payload={"kind": "result", "payload": {}, "is_error": is_error})


def test_receipts_list_server_tool_and_what_completed_means() -> None:
    plain = _receipt(is_error=False, declined=False)
    error = _receipt(is_error=True, declined=False)
    declined = _receipt(is_error=False, declined=True)
    client = Client()
    client.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
    page = client.get("/admin/ledger/terminalreceipt/")
    assert page.status_code == 200
    rows = {r.pk: r for r in page.context["cl"].result_list}
    admin = page.context["cl"].model_admin
    assert admin.outcome(rows[plain.pk]) == "-"
    assert admin.outcome(rows[error.pk]) == "isError"
    assert admin.outcome(rows[declined.pk]) == "input declined"
    html = page.content.decode()
    assert plain.operation.server.name in html and "render" in html
    searched = client.get("/admin/ledger/terminalreceipt/", {"q": error.operation.server.name})
    assert [r.pk for r in searched.context["cl"].result_list] == [error.pk]


def test_server_page_shows_the_url_without_a_deprecation_warning() -> None:
    server = ToolServerFactory(url="https://tools.example.com/mcp")
    client = Client()
    client.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        page = client.get(f"/admin/ledger/toolserver/{server.pk}/change/")
    assert page.status_code == 200
    assert "https://tools.example.com/mcp" in page.content.decode()
    assert [str(w.message) for w in caught if "assume_scheme" in str(w.message)] == []
