"""The tenant of a request: the authenticated principal's organisation, never a request field."""

from __future__ import annotations

from typing import Any

from ledger.models import Membership


def tenant_of(*, user: Any) -> str | None:
    """The organisation slug of `user`, or None for anonymous users and users without one."""
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    membership = Membership.objects.select_related("organisation").filter(user_id=user.pk).first()
    return membership.organisation.slug if membership else None


def request_tenant(request: Any) -> str:
    """The tenant of an already permission-checked request (cached on the request)."""
    cached = getattr(request, "_toolops_tenant", None)
    if cached is None:
        cached = tenant_of(user=request.user)
        if cached is None:  # IsTenantMember ran first; this is a programming error
            raise PermissionError("request has no tenant")
        request._toolops_tenant = cached
    return cached
