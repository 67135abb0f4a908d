"""API tokens in admin: who holds one and in which organisation; the key is shown once.

DRF's own token page lists every key in clear. A token is a bearer credential, so the list shows
only its first characters, and the full key appears once, in the message after it is created.
"""

from __future__ import annotations

from typing import Any

import rest_framework.authtoken.admin as drf_token_admin  # registers DRF's page, replaced below
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from rest_framework.authtoken.models import TokenProxy

KEY_HINT_CHARS = 6


class TokenAdmin(drf_token_admin.TokenAdmin):
    list_display = ("user", "organisation", "key_hint", "created")
    list_select_related = ("user__toolops_membership__organisation",)
    autocomplete_fields = ("user",)
    search_fields = ("user__username", "user__toolops_membership__organisation__slug")
    search_help_text = "User name or organisation slug (contains)."

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).select_related("user")

    @admin.display(description="organisation")
    def organisation(self, obj: TokenProxy) -> str:
        membership = getattr(obj.user, "toolops_membership", None)
        return membership.organisation.slug if membership else "- (no membership: every call is 403)"

    @admin.display(description="key")
    def key_hint(self, obj: TokenProxy) -> str:
        return f"{obj.key[:KEY_HINT_CHARS]}…"

    def response_add(self, request: HttpRequest, obj: Any, post_url_continue: str | None = None
                     ) -> HttpResponse:
        response = super().response_add(request, obj, post_url_continue)
        messages.warning(request, f"API token for {obj.user.get_username()}: {obj.key} "
                                  f"(shown once; send it as 'Authorization: Token <key>').")
        return response


admin.site.unregister(TokenProxy)
admin.site.register(TokenProxy, TokenAdmin)
