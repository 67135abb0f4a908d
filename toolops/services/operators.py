"""The first operator: a superuser who belongs to an organisation and holds an API token.

Without a membership every /api/ call is refused (the API derives the tenant from it), so a fresh
install is usable only once all three exist. They are made in one transaction: a half-made
operator (a user with no membership, say) is never left behind.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils.text import slugify
from rest_framework.authtoken.models import Token

from ledger.models import Membership, Organisation
from toolops.errors import ToolopsError


class BootstrapRefused(ToolopsError):
    pass


@dataclass(frozen=True)
class Bootstrapped:
    username: str
    organisation: str
    organisation_created: bool
    token: str


def operator_bootstrap(*, username: str, email: str, password: str, organisation: str,
                       organisation_name: str = "") -> Bootstrapped:
    """Create a superuser, its organisation (or join an existing one) and its API token.

    Refused (nothing written) when the user exists: its token would otherwise be printed again.
    """
    username = username.strip()
    slug = slugify(organisation)
    if not username:
        raise BootstrapRefused("a user name is required")
    if not slug:
        raise BootstrapRefused(f"organisation {organisation!r} gives no usable slug")
    if not password:
        raise BootstrapRefused("a password is required (the admin login needs one)")
    user_model = get_user_model()
    with transaction.atomic():
        if user_model.objects.filter(username=username).exists():
            raise BootstrapRefused(f"user {username!r} already exists; nothing was changed")
        user = user_model.objects.create_superuser(username=username, email=email, password=password)
        org, created = Organisation.objects.get_or_create(
            slug=slug, defaults={"name": organisation_name or organisation})
        Membership.objects.create(user=user, organisation=org)
        token = Token.objects.create(user=user)
    return Bootstrapped(username=username, organisation=org.slug, organisation_created=created,
                        token=token.key)
