"""Every API call needs an authenticated principal that belongs to an organisation."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission

from toolops.rest.tenancy import tenant_of


class IsTenantMember(BasePermission):
    message = "authentication required, and the principal must belong to an organisation"

    def has_permission(self, request: Any, view: Any) -> bool:
        tenant = tenant_of(user=request.user)
        if tenant is None:
            return False
        request._toolops_tenant = tenant
        return True
