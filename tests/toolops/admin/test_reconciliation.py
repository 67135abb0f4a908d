"""The reconciliation queue in Django admin: filters, search, permission-checked actions."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from ledger.models import Operation, ReconciliationItem
from ledger.states import State
from tests.ledger.factories import OperationFactory
from tests.toolops.admin.helpers import staff_client as _client
from toolops.services.reconcile import operation_to_reconciliation

pytestmark = pytest.mark.django_db
URL = "/admin/ledger/reconciliationitem/"


def _open_item(**op_fields: Any) -> ReconciliationItem:
    op = OperationFactory(**op_fields)
    return operation_to_reconciliation(op=op, lease_owner=None, reason="not_found_unknown",
                                       evidence={"classification": "UNKNOWN"})



def _ids(response: Any) -> set[int]:
    return {obj.pk for obj in response.context["cl"].result_list}


def test_list_filters_open_and_overdue_and_searches_by_remote_id_and_key() -> None:
    client, _ = _client(superuser=True)
    fresh = _open_item(remote_id="task-fresh")
    late = _open_item(remote_id="task-late")
    ReconciliationItem.objects.filter(id=late.id).update(deadline=timezone.now() - timedelta(minutes=1))
    done = _open_item(remote_id="task-done")
    ReconciliationItem.objects.filter(id=done.id).update(status="resolved", resolution="abandoned")

    assert _ids(client.get(URL, {"queue": "open"})) == {fresh.id, late.id}
    assert _ids(client.get(URL, {"queue": "overdue"})) == {late.id}
    assert _ids(client.get(URL, {"queue": "resolved"})) == {done.id}
    assert _ids(client.get(URL, {"q": "task-late"})) == {late.id}
    key = Operation.objects.get(id=fresh.operation_id).submission_key
    assert _ids(client.get(URL, {"q": key})) == {fresh.id}
    page = client.get(f"{URL}{fresh.id}/change/")
    assert page.status_code == 200 and b"not_found_unknown" in page.content


def test_action_asks_for_a_reason_then_calls_the_service_as_the_user() -> None:
    client, user = _client(superuser=True)
    item = _open_item(remote_id="")
    form = client.post(URL, {"action": "attach_remote_id", "_selected_action": [item.id]})
    assert form.status_code == 200 and b"remote_id" in form.content  # the intermediate page
    assert ReconciliationItem.objects.get(id=item.id).status == "open"
    done = client.post(URL, {"action": "attach_remote_id", "_selected_action": [item.id], "apply": "1",
                             "remote_id": "task-by-hand", "reason": "seen in the server console"})
    assert done.status_code == 302
    item.refresh_from_db()
    assert item.status == "resolved" and item.resolved_by == user.get_username()
    assert item.resolution_reason == "seen in the server console"
    op = Operation.objects.get(id=item.operation_id)
    assert op.state == State.WORKING and op.remote_id == "task-by-hand"
    # A resolved item cannot be resolved again: the service refuses, the page says so.
    again = client.post(URL, {"action": "abandon", "_selected_action": [item.id], "apply": "1",
                              "reason": "again"}, follow=True)
    assert b"already resolved" in again.content
    assert Operation.objects.get(id=op.id).state == State.WORKING


def test_accept_action_validates_the_evidence_json() -> None:
    client, _ = _client(superuser=True)
    item = _open_item()
    bad = client.post(URL, {"action": "accept_terminal", "_selected_action": [item.id], "apply": "1",
                            "terminal_status": "completed", "evidence": "{not json", "reason": "r"})
    assert bad.status_code == 200 and b"not valid JSON" in bad.content
    assert ReconciliationItem.objects.get(id=item.id).status == "open"
    ok = client.post(URL, {"action": "accept_terminal", "_selected_action": [item.id], "apply": "1",
                           "terminal_status": "failed", "evidence": '{"error": "disk full"}',
                           "reason": "server log shows the failure"})
    assert ok.status_code == 302
    assert Operation.objects.get(id=item.operation_id).state == State.ACCEPTED


def test_view_only_staff_cannot_resolve() -> None:
    client, _ = _client("view_reconciliationitem")
    item = _open_item(remote_id="")
    listing = client.get(URL)
    assert listing.status_code == 200 and item.id in _ids(listing)
    assert listing.context["action_form"] is None  # no resolve permission: no actions offered
    client.post(URL, {"action": "declare_never_created", "_selected_action": [item.id], "apply": "1",
                      "reason": "nope"})
    assert ReconciliationItem.objects.get(id=item.id).status == "open"
    assert Operation.objects.get(id=item.operation_id).state == State.RECONCILIATION_REQUIRED


def test_staff_with_the_resolve_permission_can_resolve() -> None:
    client, _ = _client("view_reconciliationitem", "resolve_reconciliationitem")
    item = _open_item(remote_id="")
    client.post(URL, {"action": "declare_never_created", "_selected_action": [item.id], "apply": "1",
                      "reason": "server owner confirmed no such call"})
    item.refresh_from_db()
    assert item.status == "resolved" and item.resolved_by == "staff"
    assert Operation.objects.get(id=item.operation_id).state == State.NOT_FOUND_SAFE


def test_take_ownership_sets_the_owner_of_open_items_only() -> None:
    client, user = _client("view_reconciliationitem", "resolve_reconciliationitem")
    open_item = _open_item()
    closed = _open_item()
    ReconciliationItem.objects.filter(id=closed.id).update(status="resolved")
    client.post(URL, {"action": "take_ownership", "_selected_action": [open_item.id, closed.id]})
    assert ReconciliationItem.objects.get(id=open_item.id).owner == user
    assert ReconciliationItem.objects.get(id=closed.id).owner is None


def test_unknown_rows_are_found_by_remote_id_or_submission_key_in_operation_admin() -> None:
    client, _ = _client(superuser=True)
    unknown = OperationFactory(state=State.SUBMISSION_UNKNOWN, remote_id="")
    gone = OperationFactory(state=State.RECONCILIATION_REQUIRED, remote_id="task-gone")
    url = "/admin/ledger/operation/"
    assert _ids(client.get(url, {"q": unknown.submission_key})) == {unknown.id}
    assert _ids(client.get(url, {"q": "task-gone"})) == {gone.id}


def test_resolve_from_the_item_page_keeps_what_was_typed_when_refused_and_writes_history() -> None:
    from django.contrib.admin.models import LogEntry
    from django.urls import reverse

    client, user = _client("view_reconciliationitem", "resolve_reconciliationitem")
    item = _open_item()
    page = client.get(f"{URL}{item.id}/change/").content.decode()
    url = reverse("admin:ledger_reconciliationitem_resolve", args=[item.id, "accept_terminal"])
    assert url in page
    refused = client.post(url, {"apply": "1", "terminal_status": "completed", "evidence": "",
                                "reason": "console says done"})
    html = refused.content.decode()
    assert refused.status_code == 200 and "the evidence must carry what was seen" in html
    assert "console says done" in html  # the reason typed is still in the form
    done = client.post(url, {"apply": "1", "terminal_status": "completed",
                             "evidence": '{"content": []}', "reason": "console says done"})
    assert done.status_code == 302 and done["Location"] == f"{URL}{item.id}/change/"
    assert LogEntry.objects.filter(user=user, object_id=str(item.id)).exists()
    assert LogEntry.objects.filter(user=user, object_id=str(item.operation_id)).exists()


def test_view_only_staff_get_no_resolve_buttons_and_a_403_on_the_resolve_page() -> None:
    from django.urls import reverse

    client, _ = _client("view_reconciliationitem")
    item = _open_item()
    assert b"Resolve this item" not in client.get(f"{URL}{item.id}/change/").content
    url = reverse("admin:ledger_reconciliationitem_resolve", args=[item.id, "abandon"])
    assert client.post(url, {"apply": "1", "reason": "x"}).status_code == 403
    assert ReconciliationItem.objects.get(id=item.id).status == "open"


def test_take_ownership_from_the_item_page() -> None:
    from django.urls import reverse

    client, user = _client("view_reconciliationitem", "resolve_reconciliationitem")
    item = _open_item()
    taken = client.post(reverse("admin:ledger_reconciliationitem_take", args=[item.id]))
    assert taken.status_code == 302
    assert ReconciliationItem.objects.get(id=item.id).owner == user
