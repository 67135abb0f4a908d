"""One permission model through every entry point: REST, admin, CLI (call_command), Python API.

Also: `accept_terminal` evidence passes the same output defense as a fetched result, from every
entry point, and evidence that fails is refused with the reasons and changes nothing.
"""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from ledger.models import Membership, Operation, Organisation, ReconciliationItem, TerminalReceipt
from ledger.states import State
from tests.ledger.factories import OperationFactory, ToolServerFactory
from tests.toolops.api_fixtures import principal
from toolops import api
from toolops.services.permissions import (
    Action,
    PermissionRefused,
    actor_for_user,
    actor_system,
    permission_allows,
)
from toolops.services.reconcile import operation_to_reconciliation

pytestmark = pytest.mark.django_db

OUTPUT_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
BAD_EVIDENCE = {"content": [{"type": "evil_script", "text": "rm -rf /"}],
                "structuredContent": {"n": "not a number"}}
GOOD_EVIDENCE = {"content": [{"type": "text", "text": "42"}], "structuredContent": {"n": 42}}


def _open_item(*, tenant: str = "acme") -> ReconciliationItem:
    server = ToolServerFactory(tenant=tenant, tools={"render": {
        "task_support": "required", "descriptor_digest": "sha256:d1",
        "descriptor": {"name": "render", "outputSchema": OUTPUT_SCHEMA}}})
    op = OperationFactory(server=server, tenant=tenant)
    return operation_to_reconciliation(op=op, lease_owner=None, reason="not_found_unknown",
                                       evidence={"classification": "UNKNOWN"})


def _user(username: str, *, org: str | None = None, role: str = Membership.Role.MEMBER,
          perms: tuple[str, ...] = (), staff: bool = False) -> User:
    user = User.objects.create_user(username, f"{username}@example.com", "pw", is_staff=staff)
    if perms:
        user.user_permissions.set(Permission.objects.filter(codename__in=perms))
    if org is not None:
        organisation, _ = Organisation.objects.get_or_create(slug=org, defaults={"name": org})
        Membership.objects.create(user=user, organisation=organisation, role=role)
    return User.objects.get(pk=user.pk)  # fresh: no cached permissions


def _unchanged(item: ReconciliationItem) -> None:
    item.refresh_from_db()
    assert item.status == ReconciliationItem.Status.OPEN
    assert Operation.objects.get(id=item.operation_id).state == State.RECONCILIATION_REQUIRED
    assert not TerminalReceipt.objects.filter(operation_id=item.operation_id).exists()


def test_the_permission_table() -> None:
    member = actor_for_user(user=_user("m", org="acme"))
    viewer = actor_for_user(user=_user("v", org="acme", role=Membership.Role.VIEWER))
    operator = actor_for_user(user=_user("o", org="acme", role=Membership.Role.OPERATOR))
    staff = actor_for_user(user=_user("s", perms=("resolve_reconciliationitem",), staff=True))
    loner = actor_for_user(user=_user("l"))
    for action in (Action.SUBMIT, Action.CANCEL, Action.ANSWER):
        assert permission_allows(actor=member, action=action, tenant="acme")
        assert permission_allows(actor=operator, action=action, tenant="acme")
        assert not permission_allows(actor=member, action=action, tenant="globex")  # other org
        assert not permission_allows(actor=viewer, action=action, tenant="acme")
        assert not permission_allows(actor=loner, action=action, tenant="")
    assert not permission_allows(actor=member, action=Action.RESOLVE, tenant="acme")
    assert permission_allows(actor=operator, action=Action.RESOLVE, tenant="acme")
    assert not permission_allows(actor=operator, action=Action.RESOLVE, tenant="globex")
    # A Django permission is valid in every organisation, and for rows without one.
    assert permission_allows(actor=staff, action=Action.RESOLVE, tenant="globex")
    assert permission_allows(actor=staff, action=Action.RESOLVE, tenant="")
    assert not permission_allows(actor=staff, action=Action.CANCEL, tenant="")
    for action in Action:
        assert permission_allows(actor=actor_system(name="cli:ops"), action=action, tenant="x")
    assert not permission_allows(actor=operator, action=Action.REGISTER, tenant="acme")
    with pytest.raises(PermissionRefused):
        actor_system(name=" ")


def test_a_member_cannot_settle_the_queue_through_rest_or_the_python_api() -> None:
    item = _open_item()
    member = principal(username="mallory", org="acme")
    body = {"resolution": "accept_terminal", "terminal_status": "completed", "reason": "trust me",
            "evidence": GOOD_EVIDENCE}
    refused = member.post(f"/api/reconciliation/{item.pk}/resolve/", body, format="json")
    assert refused.status_code == 403 and refused.json()["error"] == "PermissionRefused"
    with pytest.raises(PermissionRefused):
        api.resolve_reconciliation_item(
            item_id=item.pk, action="abandoned", reason="x",
            actor=actor_for_user(user=User.objects.get(username="mallory")), tenant="acme")
    _unchanged(item)


def test_bad_evidence_is_refused_with_reasons_by_rest() -> None:
    item = _open_item()
    operator = principal(username="olga", org="acme", role=Membership.Role.OPERATOR)
    body = {"resolution": "accept_terminal", "terminal_status": "completed", "reason": "seen",
            "evidence": BAD_EVIDENCE}
    refused = operator.post(f"/api/reconciliation/{item.pk}/resolve/", body, format="json")
    assert refused.status_code == 422, refused.content
    reasons = refused.json()["reasons"]
    assert any("evil_script" in r for r in reasons)
    assert any("structuredContent['n']" in r for r in reasons)
    _unchanged(item)
    body["evidence"] = GOOD_EVIDENCE
    done = operator.post(f"/api/reconciliation/{item.pk}/resolve/", body, format="json")
    assert done.status_code == 200, done.content
    assert Operation.objects.get(id=item.operation_id).state == State.ACCEPTED


def test_bad_evidence_is_refused_in_admin() -> None:
    item = _open_item()
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    page = client.post("/admin/ledger/reconciliationitem/", {
        "action": "accept_terminal", "_selected_action": [item.id], "apply": "1",
        "terminal_status": "completed", "evidence": json.dumps(BAD_EVIDENCE), "reason": "seen"},
        follow=True)
    assert page.status_code == 200
    text = page.content.decode()
    assert "evidence rejected by output defense" in text and "evil_script" in text
    _unchanged(item)


def test_bad_evidence_is_refused_by_the_cli_in_one_line() -> None:
    item = _open_item(tenant="")
    with pytest.raises(CommandError) as refused:
        call_command("toolops", "reconcile", "--resolve", str(item.pk), "--action", "accept_terminal",
                     "--terminal-status", "completed", "--evidence", json.dumps(BAD_EVIDENCE),
                     "--reason", "seen")
    message = str(refused.value)
    assert "\n" not in message and "evil_script" in message
    _unchanged(item)


def test_bad_evidence_is_refused_by_the_python_api_then_good_evidence_accepted() -> None:
    item = _open_item()
    with pytest.raises(api.EvidenceRejected) as refused:
        api.resolve_reconciliation_item(item_id=item.pk, action="accept_terminal",
                                        terminal_status="completed", evidence=BAD_EVIDENCE,
                                        reason="seen")
    assert len(refused.value.reasons) >= 2
    _unchanged(item)
    # A failed attestation is not held to the outputSchema (tool errors report in content).
    view = api.resolve_reconciliation_item(item_id=item.pk, action="accept_terminal",
                                           terminal_status="failed",
                                           evidence={"content": [{"type": "text", "text": "no"}]},
                                           reason="server log shows the failure")
    assert view.state == State.ACCEPTED and view.receipt is not None


def test_a_viewer_cannot_submit_cancel_or_answer() -> None:
    server = ToolServerFactory(tenant="acme")
    op = OperationFactory(server=server, tenant="acme", state=State.WORKING)
    viewer = principal(username="val", org="acme", role=Membership.Role.VIEWER)
    submit = viewer.post("/api/operations/", {"server": server.name, "tool": "render",
                                              "call_node_id": "n-1"}, format="json")
    assert submit.status_code == 403, submit.content
    assert viewer.post(f"/api/operations/{op.id}/cancel/", {}, format="json").status_code == 403
    ir = op.input_requests.create(round=1, server_request_id="r1", method="elicitation/create",
                                  params={}, schema_digest="sha256:x", deadline=op.created_at)
    answer = viewer.post(f"/api/input-requests/{ir.pk}/answer/",
                         {"schema_digest": "sha256:x", "response": {"action": "decline"}}, format="json")
    assert answer.status_code == 403, answer.content
    user = actor_for_user(user=User.objects.get(username="val"))
    for call in (lambda: api.cancel_operation(operation_id=op.id, actor=user),
                 lambda: api.submit_call(server=server.name, tool="render", call_node_id="n-2",
                                         tenant="acme", actor=user),
                 lambda: api.answer_input(operation_id=op.id, input_round=1, schema_digest="sha256:x",
                                          response={"action": "decline"}, actor=user)):
        with pytest.raises(PermissionRefused):
            call()
    op.refresh_from_db()
    assert op.state == State.WORKING and Operation.objects.count() == 1


def test_admin_answer_checks_the_service_permission_too() -> None:
    """Admin staff without the answer permission: the view refuses, and so would the service."""
    op = OperationFactory(state=State.INPUT_REQUIRED)
    ir = op.input_requests.create(round=1, server_request_id="r1", method="elicitation/create",
                                  params={}, schema_digest="sha256:x", deadline=op.created_at)
    staff = _user("stan", perms=("view_inputrequest",), staff=True)
    client = Client()
    client.force_login(staff)
    assert client.post(f"/admin/ledger/inputrequest/{ir.pk}/answer/", {
        "input_round": 1, "schema_digest": "sha256:x", "action": "decline"}).status_code == 403
    with pytest.raises(PermissionRefused):
        api.answer_input(operation_id=op.id, input_round=1, schema_digest="sha256:x",
                         response={"action": "decline"}, actor=actor_for_user(user=staff))
    assert ir.__class__.objects.get(pk=ir.pk).status == "open"


def test_a_stored_result_is_defended_again_when_accepted_without_evidence() -> None:
    """No evidence: the fetched result would be accepted; it must pass the pipeline as it stands."""
    from ledger.digests import canonical_digest

    item = _open_item()
    stored = {"kind": "result", "payload": BAD_EVIDENCE, "is_error": False, "status_message": ""}
    Operation.objects.filter(id=item.operation_id).update(
        result=stored, result_kind="result", result_digest=canonical_digest(stored),
        terminal_status="completed")
    with pytest.raises(api.EvidenceRejected):
        api.resolve_reconciliation_item(item_id=item.pk, action="accept_terminal",
                                        terminal_status="completed", reason="the fetched one")
    _unchanged(item)


def test_taking_an_item_needs_the_resolve_permission_in_the_service() -> None:
    from toolops.services.reconcile import reconciliation_take

    item = _open_item()
    member = _user("walter", org="acme")
    operator = _user("olga", org="acme", role=Membership.Role.OPERATOR)
    with pytest.raises(PermissionRefused):
        reconciliation_take(item_id=item.pk, user_id=member.pk, actor=actor_for_user(user=member))
    item.refresh_from_db()
    assert item.owner_id is None
    assert reconciliation_take(item_id=item.pk, user_id=operator.pk,
                               actor=actor_for_user(user=operator))
    item.refresh_from_db()
    assert item.owner_id == operator.pk
