"""Rollout pages: read-only views of the canary/shadow settings, the audit trail of
rollbacks and roll-forwards, and the shadow comparisons. Changes go through the CLI services
(`toolops rollout`, `toolops rollback`), which record who and why; admin never edits them."""

from __future__ import annotations

from django.contrib import admin

from ledger.admin import ReadOnlyAdmin
from ledger.models import RolloutChange, RolloutConfig, ShadowComparison


@admin.register(RolloutConfig)
class RolloutConfigAdmin(ReadOnlyAdmin):
    list_display = ("server", "tool_name", "canary_bp", "tasks_enabled", "shadow_enabled",
                    "declared_read_only", "updated_at")
    list_filter = ("tasks_enabled", "shadow_enabled", "server")


@admin.register(RolloutChange)
class RolloutChangeAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "action", "actor", "reason", "server", "tool_name",
                    "from_path", "to_path", "rows_moved")
    list_filter = ("action",)
    search_fields = ("actor", "reason")
    ordering = ("-created_at",)


@admin.register(ShadowComparison)
class ShadowComparisonAdmin(ReadOnlyAdmin):
    list_display = ("call_node_id", "tool_name", "verdict", "shadow_terminal_status",
                    "legacy_terminal_status", "compared_at")
    list_filter = ("verdict", "tool_name")
    search_fields = ("call_node_id",)
    ordering = ("-created_at",)
