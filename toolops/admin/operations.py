"""Operations in admin: a list for "what is stuck, since when, where" and a page that reads as a timeline.

The row is read-only; the one action, cancel, asks for confirmation on its own page and calls
`operation_cancel`, which locks, checks and records. A refusal is shown on that page with its
reason. Cancelling needs `ledger.cancel_operation`; viewing needs the view permission.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html

from ledger.admin import ReadOnlyAdmin, truncated
from ledger.models import Operation, ReconciliationItem
from ledger.states import State
from toolops.admin.timeline import timeline_page
from toolops.errors import ToolopsError
from toolops.services.cancel import operation_cancel
from toolops.services.permissions import actor_for_user

CANCEL_PERMISSION = "ledger.cancel_operation"
CANCELLABLE = frozenset({State.WORKING, State.INPUT_REQUIRED})


def age(since: Any) -> str:
    """How long ago, for a list column."""
    return duration((timezone.now() - since).total_seconds())


def duration(seconds: float) -> str:
    """A duration for a list column: "45s", "12m 03s", "3h 07m", "2d 04h"."""
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def pretty_json(value: Any) -> str:
    if value in (None, {}, []):
        return "-"
    return format_html('<pre class="toolops-json">{}</pre>',
                       json.dumps(value, indent=2, sort_keys=True, default=str))


def server_state_shown(op: Operation) -> str:
    """The server's state as we know it. After an operator settled the row by hand, what the server
    last said is stale: show what the operator attested, or that nothing was observed."""
    settled = (ReconciliationItem.objects.filter(operation=op, status=ReconciliationItem.Status.RESOLVED)
               .exclude(resolution=ReconciliationItem.Resolution.ATTACH_REMOTE_ID)
               .order_by("-resolved_at").first())
    if settled is None:
        return op.server_state or "-"
    last_seen = f" (server last said {op.server_state!r})" if op.server_state else ""
    if settled.resolution == ReconciliationItem.Resolution.ACCEPT_TERMINAL:
        return (f"not observed: {op.terminal_status or 'terminal'} attested by "
                f"{settled.resolved_by}{last_seen}")
    return f"not observed: settled as {settled.resolution} by {settled.resolved_by}{last_seen}"


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin):
    list_display = ("short_id", "call_node", "server", "tool_name", "state", "server_state_column",
                    "remote", "created_at", "age")
    list_display_links = ("short_id",)
    list_filter = ("state", "server", "adapter_version", "execution_mode", "tenant")
    list_select_related = ("server",)
    date_hierarchy = "created_at"
    # Every UNKNOWN row must be findable by remote (task) id or by submission key.
    search_fields = ("=id", "^remote_id", "=submission_key", "^call_node_id", "=server__name",
                     "=tool_name")
    search_help_text = ("Operation id or submission key (exact), remote id or call node (prefix), "
                        "server or tool name (exact).")
    ordering = ("-created_at",)
    change_form_template = "admin/ledger/operation/change_form.html"
    _sections: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("Call", ("id", "call_node_id", "tenant", "server", "tool_name", "execution_mode",
                  "adapter_version", "submission_key", "remote_id")),
        ("State", ("state", "server_state_display", "server_status_message", "terminal_status",
                   "result_kind", "created_at", "updated_at", "expires_at")),
        ("Polling", ("next_poll_at", "poll_attempts", "poll_interval_ms", "lease_owner",
                     "lease_expires_at", "execution_epoch", "cancel_generation", "input_round",
                     "executor_path")),
        ("Request and result", ("body_pretty", "result_pretty", "request_digest", "result_digest")),
    )
    # The timeline below is what an operator reads; the bookkeeping sections start folded.
    fieldsets = tuple(
        (title, {"fields": fields, "classes": [] if title in ("Call", "State") else ["collapse"]})
        for title, fields in _sections)
    readonly_fields = tuple(f for _, fields in _sections for f in fields)

    @admin.display(description="operation", ordering="id")
    def short_id(self, obj: Operation) -> str:
        return format_html('<span class="toolops-mono" title="{}">{}…</span>', obj.id, str(obj.id)[:8])

    @admin.display(description="call node", ordering="call_node_id")
    def call_node(self, obj: Operation) -> str:
        return truncated(obj.call_node_id, width=28)

    @admin.display(description="remote id", ordering="remote_id")
    def remote(self, obj: Operation) -> str:
        return truncated(obj.remote_id)

    @admin.display(description="age", ordering="created_at")
    def age(self, obj: Operation) -> str:
        return age(obj.created_at)

    @admin.display(description="server state")
    def server_state_display(self, obj: Operation) -> str:
        return server_state_shown(obj)

    @admin.display(description="request body")
    def body_pretty(self, obj: Operation) -> str:
        return pretty_json(obj.body)

    @admin.display(description="result")
    def result_pretty(self, obj: Operation) -> str:
        return pretty_json(obj.result)

    @admin.display(description="server state", ordering="server_state")
    def server_state_column(self, obj: Operation) -> str:
        if getattr(obj, "settled_by_hand", False):
            return "not observed (settled by an operator)"
        return obj.server_state or "-"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Operation]:
        settled = ReconciliationItem.objects.filter(
            operation_id=OuterRef("pk"), status=ReconciliationItem.Status.RESOLVED,
        ).exclude(resolution=ReconciliationItem.Resolution.ATTACH_REMOTE_ID)
        return (super().get_queryset(request).select_related("server")
                .annotate(settled_by_hand=Exists(settled)))

    def get_urls(self) -> list[URLPattern]:
        cancel = path("<uuid:pk>/cancel/", self.admin_site.admin_view(self.cancel_view),
                      name="ledger_operation_cancel")
        return [cancel, *super().get_urls()]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        op = self.get_object(request, object_id)
        if op is None:
            return super().change_view(request, object_id, form_url, extra_context)
        receipt = getattr(op, "receipt", None)
        context = {
            **(extra_context or {}),
            "timeline": timeline_page(operation_id=op.id, page_number=request.GET.get("timeline")),
            "receipt": receipt,
            "outbox": getattr(receipt, "outbox", None) if receipt else None,
            "reconciliation_items": op.reconciliation_items.order_by("created_at"),
            "input_requests": op.input_requests.select_related("answered_by").order_by("round"),
            "effect_reconciliations": op.effect_reconciliations.order_by("created_at"),
            "can_cancel": op.state in CANCELLABLE and request.user.has_perm(CANCEL_PERMISSION),
        }
        return super().change_view(request, object_id, form_url, context)

    def cancel_view(self, request: HttpRequest, pk: uuid.UUID) -> HttpResponse:
        if not request.user.has_perm(CANCEL_PERMISSION):
            raise PermissionDenied("cancelling operations needs " + CANCEL_PERMISSION)
        op = get_object_or_404(Operation.objects.select_related("server"), pk=pk)
        page = reverse("admin:ledger_operation_change", args=[op.pk])
        error = ""
        if request.method == "POST":
            try:
                outcome = operation_cancel(operation_id=op.id, actor=actor_for_user(user=request.user))
            except ToolopsError as exc:
                error = str(exc)
            else:
                self.log_change(request, op, f"cancel requested: {outcome}")
                messages.success(request, f"Cancel of {op.id} requested: {outcome}.")
                return HttpResponseRedirect(page)
        return TemplateResponse(request, "admin/toolops/confirm.html", {
            **self.admin_site.each_context(request),
            "title": "Cancel this operation?", "opts": self.model._meta, "object": op,
            "error": error, "back_url": page, "confirm_label": "Yes, cancel it",
            "explanation": ("A cancel is sent to the server. The call ends as cancelled only when "
                            "the server confirms; polling continues until then."),
            "details": [("operation", str(op.id)), ("call node", op.call_node_id),
                        ("server / tool", f"{op.server.name} / {op.tool_name}"),
                        ("state", op.state), ("remote id", op.remote_id or "-")],
        })
