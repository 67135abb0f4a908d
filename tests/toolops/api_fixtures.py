"""Shared helpers for the API tests: organisations, principals with tokens, a registered server."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from ledger.models import Membership, Organisation


def principal(*, username: str, org: str, role: str = Membership.Role.MEMBER) -> APIClient:
    """A user of organisation `org` (created if needed) with `role`, authenticated by a real API
    token."""
    organisation, _ = Organisation.objects.get_or_create(slug=org, defaults={"name": org.title()})
    user = get_user_model().objects.create_user(username=username, password="pw-" + username)
    Membership.objects.create(user=user, organisation=organisation, role=role)
    token = Token.objects.create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client
