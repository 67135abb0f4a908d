"""Organisations, memberships and API tokens in admin; the token key is shown once."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.authtoken.models import Token

from ledger.models import Membership, Organisation

pytestmark = pytest.mark.django_db


@pytest.fixture
def root() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def test_an_organisation_and_its_member_are_made_in_admin_and_the_api_then_answers(root: Client) -> None:
    bob = User.objects.create_user("bob", password="pw")
    assert root.get("/admin/ledger/organisation/").status_code == 200
    added = root.post("/admin/ledger/organisation/add/", {
        "slug": "acme", "name": "Acme",
        "members-TOTAL_FORMS": "1", "members-INITIAL_FORMS": "0",
        "members-MIN_NUM_FORMS": "0", "members-MAX_NUM_FORMS": "1000",
        "members-0-user": str(bob.pk),
    })
    assert added.status_code == 302, added.content.decode()[:2000]
    assert Membership.objects.get(user=bob).organisation == Organisation.objects.get(slug="acme")
    page = root.get("/admin/ledger/membership/")
    assert page.status_code == 200 and b"bob" in page.content

    api = Client()
    api.force_login(bob)
    assert api.get("/api/servers/").status_code == 200


def test_tokens_list_hides_keys_and_a_new_key_is_shown_once(root: Client) -> None:
    ana = User.objects.create_user("ana")
    Membership.objects.create(user=ana, organisation=Organisation.objects.create(slug="o", name="O"))
    added = root.post("/admin/authtoken/tokenproxy/add/", {"user": str(ana.pk)}, follow=True)
    key = Token.objects.get(user=ana).key
    assert key in added.content.decode() and "shown once" in added.content.decode()
    listing = root.get("/admin/authtoken/tokenproxy/").content.decode()
    assert key not in listing and key[:6] in listing and ">o<" in listing
    assert Client().get("/api/servers/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200
