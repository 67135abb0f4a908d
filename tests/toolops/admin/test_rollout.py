"""Rollout pages in admin: read-only lists of settings, changes and shadow comparisons."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from ledger.models import RolloutChange, ShadowComparison
from ledger.states import State
from tests.ledger.factories import OperationFactory

pytestmark = pytest.mark.django_db


def _superuser_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def test_shadow_comparisons_are_listed_filtered_and_read_only() -> None:
    legacy = OperationFactory(state=State.ACCEPTED)
    shadow = OperationFactory(call_node_id=legacy.call_node_id, shadow=True, shadow_of=legacy,
                              state=State.ACCEPTED)
    ShadowComparison.objects.create(shadow_operation=shadow, legacy_operation=legacy,
                                    call_node_id=legacy.call_node_id, tool_name="render",
                                    shadow_terminal_status="completed", verdict="disagree")
    client = _superuser_client()
    url = "/admin/ledger/shadowcomparison/"
    page = client.get(url, {"verdict__exact": "disagree"})
    assert page.status_code == 200
    assert [c.pk for c in page.context["cl"].result_list] == [shadow.shadow_comparison.pk]
    assert client.get(url, {"verdict__exact": "agree"}).context["cl"].result_list.count() == 0
    assert client.get(url + "add/").status_code == 403


def test_rollout_changes_show_who_and_why() -> None:
    RolloutChange.objects.create(action="rollback", actor="oncall:ana", reason="error budget",
                                 from_path="tasks", to_path="legacy", rows_moved=3)
    page = _superuser_client().get("/admin/ledger/rolloutchange/", {"q": "ana"})
    assert page.status_code == 200
    assert b"oncall:ana" in page.content and b"error budget" in page.content
