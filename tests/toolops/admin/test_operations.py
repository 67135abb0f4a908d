"""Operations in admin: list columns and search, the timeline page, cancel with confirmation."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from ledger.models import InputRequest, Operation, OperationEvent, ReconciliationItem, ToolServer
from ledger.states import State
from tests.ledger.factories import OperationFactory
from tests.toolops.admin.helpers import staff_client as _client
from toolops.runner import run_embedded
from toolops.services.reconcile import operation_to_reconciliation, reconciliation_accept_terminal
from toolops.services.servers import server_add
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db
LIST = "/admin/ledger/operation/"



def _page(op: Operation) -> str:
    return reverse("admin:ledger_operation_change", args=[op.pk])


def test_list_shows_server_created_and_age_and_searches_what_it_says() -> None:
    client, _ = _client(superuser=True)
    render = OperationFactory(remote_id="task-9f2c-aaaa", call_node_id="plan-9/step-1")
    other = OperationFactory(remote_id="task-1234-bbbb", tool_name="search")
    page = client.get(LIST)
    html = page.content.decode()
    for column in ("server", "created at", "age", "remote id", "server state"):
        assert f">{column}<" in html.lower() or column in html.lower()
    assert "remote id or call node (prefix)" in html
    ids = lambda q: {o.pk for o in client.get(LIST, {"q": q}).context["cl"].result_list}  # noqa: E731
    assert ids("task-9f2c") == {render.pk}
    assert ids("plan-9/") == {render.pk}
    assert ids(str(other.pk)) == {other.pk}
    assert ids(other.server.name) == {other.pk}
    assert ids("search") == {other.pk}


def test_operation_page_folds_polls_and_links_related_records() -> None:
    client, _ = _client(superuser=True)
    op = OperationFactory(remote_id="task-p")
    OperationEvent.objects.bulk_create(
        [OperationEvent(operation=op, seq=1, kind="submitted", from_state=State.SUBMITTING,
                        to_state=State.WORKING, server_state="working", execution_epoch=1,
                        cancel_generation=0)]
        + [OperationEvent(operation=op, seq=s, kind="observed", from_state=State.WORKING,
                          to_state=State.WORKING, server_state="working", execution_epoch=1,
                          cancel_generation=0) for s in range(2, 80)])
    item = operation_to_reconciliation(op=op, lease_owner=None, reason="lost_session", evidence={})
    html = client.get(_page(op)).content.decode()
    assert "78 \N{MULTIPLICATION SIGN} observed" in html
    assert reverse("admin:ledger_reconciliationitem_change", args=[item.pk]) in html
    assert "Input rounds:" in html and "Effect reconciliations:" in html and "Outbox:" in html
    assert '<pre class="toolops-json">' in html  # request body pretty-printed


def test_server_state_beside_an_operator_settlement_is_what_was_attested() -> None:
    client, _ = _client(superuser=True)
    op = OperationFactory(server_state="working")
    item = operation_to_reconciliation(op=op, lease_owner=None, reason="not_found_unknown", evidence={})
    reconciliation_accept_terminal(item_id=item.pk, terminal_status="completed",
                                   evidence={"content": []}, actor="ana", reason="seen")
    assert Operation.objects.get(pk=op.pk).state == State.ACCEPTED
    html = client.get(_page(op)).content.decode()
    assert "not observed: completed attested by ana (server last said &#x27;working&#x27;)" in html
    listing = client.get(LIST).content.decode()
    assert "not observed (settled by an operator)" in listing


@pytest.fixture
def waiting(mcp_url: str) -> Operation:
    server: ToolServer = server_add(name="ref", url=mcp_url)
    op = operation_submit(server_name=server.name, tool_name="ask_input", call_node_id="adm-c",
                          arguments={"question": "go on?"}, ttl_ms=60_000)
    run_embedded(until_idle=True, max_seconds=15)
    op.refresh_from_db()
    assert op.state == State.INPUT_REQUIRED
    return op


def test_cancel_asks_for_confirmation_then_cancels_and_writes_history(waiting: Operation) -> None:
    client, user = _client("view_operation", "cancel_operation")
    assert "Cancel operation" in client.get(_page(waiting)).content.decode()
    url = reverse("admin:ledger_operation_cancel", args=[waiting.pk])
    confirm = client.get(url)
    assert confirm.status_code == 200 and b"Yes, cancel it" in confirm.content
    assert Operation.objects.get(pk=waiting.pk).state == State.INPUT_REQUIRED  # nothing sent yet
    done = client.post(url, {"confirm": "Yes, cancel it"})
    assert done.status_code == 302 and done["Location"] == _page(waiting)
    assert Operation.objects.get(pk=waiting.pk).state in (State.CANCEL_REQUESTED,
                                                          State.CANCELLED_ACCEPTED)
    assert LogEntry.objects.filter(object_id=str(waiting.pk), user=user,
                                   change_message__startswith="cancel requested").exists()


def test_a_refused_cancel_stays_on_the_page_with_the_reason() -> None:
    client, _ = _client("view_operation", "cancel_operation")
    op = OperationFactory(state=State.ACCEPTED)
    page = client.post(reverse("admin:ledger_operation_cancel", args=[op.pk]), {"confirm": "1"})
    assert page.status_code == 200
    assert b"Refused:" in page.content and b"only WORKING or INPUT_REQUIRED" in page.content
    assert "Cancel operation" not in client.get(_page(op)).content.decode()  # not cancellable


def test_cancel_needs_the_change_permission(waiting: Operation) -> None:
    client, _ = _client("view_operation")
    assert "Cancel operation" not in client.get(_page(waiting)).content.decode()
    url = reverse("admin:ledger_operation_cancel", args=[waiting.pk])
    assert client.get(url).status_code == 403
    assert client.post(url, {"confirm": "1"}).status_code == 403
    assert Operation.objects.get(pk=waiting.pk).state == State.INPUT_REQUIRED
    assert InputRequest.objects.get(operation=waiting).status == InputRequest.Status.OPEN
    assert not ReconciliationItem.objects.exists()
