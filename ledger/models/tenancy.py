"""Tenancy: an organisation owns operations and (optionally) tool servers.

Kept deliberately small. A tenant is identified by its organisation's slug, stored as a plain
`tenant` column on Operation and ToolServer (blank = no tenant: the embedded/CLI default, and
servers shared by every tenant). A plain column instead of a foreign key keeps the ledger usable
without tenancy and keeps every existing write path unchanged; the API derives the tenant from the
authenticated principal's membership, never from the request body.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Organisation(models.Model):
    slug = models.SlugField(max_length=100, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    """A principal belongs to exactly one organisation (the DB constraint is the OneToOne).

    The role says what the principal may do to its organisation's rows (toolops/services/
    permissions.py has the table); a Django permission grants the same action across every
    organisation, for operators.
    """

    class Role(models.TextChoices):
        VIEWER = "viewer"  # reads only
        MEMBER = "member"  # submits, cancels and answers input rounds
        OPERATOR = "operator"  # and resolves reconciliation items

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="toolops_membership")
    organisation = models.ForeignKey(Organisation, on_delete=models.CASCADE, related_name="members")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.user_id} in {self.organisation_id}"
