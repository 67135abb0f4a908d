"""The admin gate for input rounds: listing, a permission-checked answer form, refusals."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from ledger.models import EffectReconciliation, InputRequest, Operation, ToolServer
from ledger.states import State
from toolops.runner import run_embedded
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def waiting(server: ToolServer) -> Operation:
    op = operation_submit(server_name=server.name, tool_name="ask_input", call_node_id="adm-1",
                          arguments={"question": "which colour?"}, ttl_ms=60_000)
    run_embedded(until_idle=True, max_seconds=15)
    op.refresh_from_db()
    assert op.state == State.INPUT_REQUIRED
    return op


def _staff(*perms: str) -> Client:
    user = User.objects.create_user(username="op-" + "-".join(perms or ("none",)), password="x",
                                    is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def _answer_url(op: Operation) -> str:
    ir = InputRequest.objects.get(operation=op, round=1)
    return reverse("admin:ledger_inputrequest_answer", args=[ir.pk])


def test_changelist_lists_open_requests_with_an_answer_link(waiting: Operation) -> None:
    client = _staff("view_inputrequest", "change_inputrequest")
    page = client.get(reverse("admin:ledger_inputrequest_changelist"))
    assert page.status_code == 200
    html = page.content.decode()
    assert "which colour?" in html and str(waiting.id) in html and _answer_url(waiting) in html


def test_a_view_only_user_sees_no_answer_link(waiting: Operation) -> None:
    client = _staff("view_inputrequest")
    html = client.get(reverse("admin:ledger_inputrequest_changelist")).content.decode()
    assert "which colour?" in html and _answer_url(waiting) not in html
    ir = InputRequest.objects.get(operation=waiting, round=1)
    page = client.get(reverse("admin:ledger_inputrequest_change", args=[ir.pk])).content.decode()
    assert "which colour?" in page and _answer_url(waiting) not in page


def test_answer_needs_the_change_permission(waiting: Operation) -> None:
    client = _staff("view_inputrequest")
    url = _answer_url(waiting)
    assert client.get(url).status_code == 403
    ir = InputRequest.objects.get(operation=waiting, round=1)
    posted = client.post(url, {"input_round": 1, "schema_digest": ir.schema_digest,
                               "action": "accept", "content": '{"value": "red"}'})
    assert posted.status_code == 403
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.OPEN
    waiting.refresh_from_db()
    assert waiting.state == State.INPUT_REQUIRED


def test_answer_form_delivers_and_polling_resumes(waiting: Operation) -> None:
    client = _staff("view_inputrequest", "change_inputrequest")
    url = _answer_url(waiting)
    form = client.get(url)
    assert form.status_code == 200 and "which colour?" in form.content.decode()
    ir = InputRequest.objects.get(operation=waiting, round=1)
    posted = client.post(url, {"input_round": 1, "schema_digest": ir.schema_digest,
                               "action": "accept", "content": '{"value": "red"}'})
    assert posted.status_code == 302
    ir.refresh_from_db()
    assert ir.status == InputRequest.Status.ANSWERED and ir.answered_by is not None
    waiting.refresh_from_db()
    assert waiting.state == State.WORKING
    run_embedded(until_idle=True, max_seconds=15)
    waiting.refresh_from_db()
    assert waiting.state == State.ACCEPTED


def test_stale_digest_in_the_form_is_shown_as_an_error(waiting: Operation) -> None:
    client = _staff("view_inputrequest", "change_inputrequest")
    posted = client.post(_answer_url(waiting), {"input_round": 1, "schema_digest": "sha256:old",
                                                "action": "accept", "content": '{"value": "r"}'})
    assert posted.status_code == 200
    assert "stale schema digest" in posted.content.decode()
    assert InputRequest.objects.get(operation=waiting).status == InputRequest.Status.OPEN


def test_effect_records_are_listed(waiting: Operation) -> None:
    EffectReconciliation.objects.create(operation=waiting, observed_status="completed",
                                        source="poll")
    client = _staff("view_effectreconciliation")
    page = client.get(reverse("admin:ledger_effectreconciliation_changelist"))
    assert page.status_code == 200 and "completed" in page.content.decode()
    assert waiting.server.name in page.content.decode()
    record = EffectReconciliation.objects.get(operation=waiting)
    detail = client.get(reverse("admin:ledger_effectreconciliation_change", args=[record.pk]))
    assert detail.status_code == 200 and b"poll" in detail.content
