"""Django admin for operators: the ledger is read-only here; changes go through services."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from ledger.models import Operation, OperationEvent, OutboxEvent, TerminalReceipt, ToolServer


class ReadOnlyAdmin(admin.ModelAdmin):
    """Ledger rows change only through guarded services, never through a raw admin form."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class OperationEventInline(admin.TabularInline):
    model = OperationEvent
    extra = 0
    can_delete = False
    fields = ("seq", "kind", "from_state", "to_state", "server_state", "execution_epoch",
              "cancel_generation", "data", "created_at")
    readonly_fields = fields
    ordering = ("seq",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin):
    list_display = ("id", "call_node_id", "tool_name", "state", "server_state", "remote_id",
                    "execution_epoch", "cancel_generation", "updated_at")
    list_filter = ("state", "server_state", "adapter_version", "server")
    # Every UNKNOWN row must be findable by remote (task) id or by submission key.
    search_fields = ("=id", "=remote_id", "=submission_key", "call_node_id")
    inlines = [OperationEventInline]
    ordering = ("-created_at",)


@admin.register(TerminalReceipt)
class TerminalReceiptAdmin(ReadOnlyAdmin):
    list_display = ("id", "call_node_id", "terminal_status", "execution_epoch", "remote_id",
                    "accepted_at")
    list_filter = ("terminal_status",)
    search_fields = ("call_node_id", "remote_id")


@admin.register(OutboxEvent)
class OutboxEventAdmin(ReadOnlyAdmin):
    list_display = ("id", "topic", "receipt", "created_at", "published_at", "attempts")


@admin.register(ToolServer)
class ToolServerAdmin(ReadOnlyAdmin):
    list_display = ("name", "url", "adapter_version", "status", "protocol_version", "max_qps",
                    "negotiated_at")
    exclude = ("session_id",)  # a session id is a bearer credential for the server's tasks
