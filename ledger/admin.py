"""Django admin for the ledger's own rows: receipts, outbox, servers, organisations, memberships.

Ledger rows are read-only here; they change only through guarded services. Pages whose actions
call executor services (operations, the reconciliation queue, input rounds) live in toolops/admin/
because the ledger imports nothing from toolops. Organisations and memberships are configuration,
not ledger history, so they are edited here like any Django model.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import models
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from ledger.models import (
    InputRequest,
    Membership,
    Organisation,
    OutboxEvent,
    TerminalReceipt,
    ToolServer,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Ledger rows change only through guarded services, never through a raw admin form."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class OperationColumns:
    """List columns for rows that belong to an operation (receipts, input rounds, queue items)."""

    @admin.display(description="server", ordering="operation__server__name")
    def server(self, obj: Any) -> str:
        return str(obj.operation.server.name)

    @admin.display(description="tool", ordering="operation__tool_name")
    def tool(self, obj: Any) -> str:
        return str(obj.operation.tool_name)


def operation_link(operation_id: Any, *, short: bool = True) -> str:
    """A link to an operation's page; the short form keeps list columns narrow."""
    url = reverse("admin:ledger_operation_change", args=[operation_id])
    text = f"{str(operation_id)[:8]}…" if short else str(operation_id)
    return format_html('<a href="{}" title="{}" class="toolops-mono">{}</a>', url, operation_id, text)


def truncated(value: str, *, width: int = 24) -> str:
    """A long identifier cut to `width` characters, whole in the tooltip."""
    if len(value) <= width:
        return value or "-"
    return format_html('<span title="{}">{}…</span>', value, value[:width])


@admin.register(TerminalReceipt)
class TerminalReceiptAdmin(OperationColumns, ReadOnlyAdmin):
    list_display = ("id", "accepted_at", "call_node_id", "server", "tool", "terminal_status",
                    "outcome", "operation", "remote")
    list_filter = ("terminal_status", "operation__server")
    date_hierarchy = "accepted_at"
    search_fields = ("=operation__id", "^remote_id", "^call_node_id", "=operation__server__name",
                     "=operation__tool_name")
    search_help_text = ("Operation id (exact), remote id or call node (prefix), server or tool name "
                        "(exact).")
    ordering = ("-accepted_at",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[TerminalReceipt]:
        declined = InputRequest.objects.filter(operation_id=OuterRef("operation_id"),
                                               answer__action="decline")
        return (super().get_queryset(request).select_related("operation__server")
                .annotate(input_declined=Exists(declined)))

    @admin.display(description="outcome")
    def outcome(self, obj: TerminalReceipt) -> str:
        """What "completed" hides: a tool error result (isError) or a declined input round."""
        marks = []
        payload = obj.payload if isinstance(obj.payload, dict) else {}
        if payload.get("is_error"):
            marks.append("isError")
        if payload.get("kind") == "attested":
            marks.append("attested by " + str(payload.get("attested_by", "an operator")))
        if getattr(obj, "input_declined", False):
            marks.append("input declined")
        return ", ".join(marks) or "-"

    @admin.display(description="operation")
    def operation(self, obj: TerminalReceipt) -> str:
        return operation_link(obj.operation_id)

    @admin.display(description="remote id", ordering="remote_id")
    def remote(self, obj: TerminalReceipt) -> str:
        return truncated(obj.remote_id)


@admin.register(OutboxEvent)
class OutboxEventAdmin(ReadOnlyAdmin):
    list_display = ("id", "topic", "receipt", "created_at", "published_at", "attempts", "last_error")
    list_filter = ("topic", ("published_at", admin.EmptyFieldListFilter))
    date_hierarchy = "created_at"
    search_fields = ("=receipt__operation__id", "^receipt__call_node_id")
    search_help_text = "Operation id (exact) or call node (prefix)."
    ordering = ("-created_at",)


@admin.register(ToolServer)
class ToolServerAdmin(ReadOnlyAdmin):
    list_display = ("name", "url", "adapter_version", "status", "protocol_version", "max_qps",
                    "tenant", "negotiated_at")
    list_filter = ("status", "adapter_version")
    search_fields = ("name", "url")
    search_help_text = "Server name or URL (contains)."
    exclude = ("session_id",)  # a session id is a bearer credential for the server's tasks
    # The page is read-only, but Django still builds the form field behind the URL. Naming the
    # scheme a bare host would take (Django 6's default, https) keeps the page from leaning on the
    # deprecated http default, which warns on every render.
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ("user",)
    fields = ("user", "created_at")
    readonly_fields = ("created_at",)


@admin.register(Organisation)
class OrganisationAdmin(admin.ModelAdmin):
    """A principal sees and acts on its organisation's operations only: give it a membership."""

    list_display = ("slug", "name", "members_count", "created_at")
    search_fields = ("slug", "name")
    search_help_text = "Slug or name (contains)."
    prepopulated_fields = {"slug": ("name",)}
    inlines = [MembershipInline]

    @admin.display(description="members")
    def members_count(self, obj: Organisation) -> int:
        return obj.members.count()


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "organisation", "created_at")
    list_filter = ("organisation",)
    list_select_related = ("user", "organisation")
    search_fields = ("user__username", "organisation__slug")
    search_help_text = "User name or organisation slug (contains)."
    autocomplete_fields = ("user", "organisation")
