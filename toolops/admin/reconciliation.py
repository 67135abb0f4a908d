"""The manual reconciliation queue in Django admin.

Items are read-only here. Each resolution asks for a reason (and what it needs) on its own page,
from the list (several items) or from an item's page (one), then calls ONE service per item; the
services lock, check and record who and why. A refused resolution re-renders the page with the
reason and everything typed. Every resolution is written to admin's history (LogEntry) on the item
and on its operation. Resolving needs `ledger.resolve_reconciliationitem`; viewing needs view.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html

from ledger.admin import OperationColumns, operation_link, truncated
from ledger.models import ReconciliationItem
from ledger.states import TerminalStatus
from toolops.admin.forms import form_json_object
from toolops.admin.operations import age, duration, pretty_json
from toolops.services.permissions import PermissionRefused, actor_for_user
from toolops.services.reconcile import (
    ReconciliationRefused,
    reconciliation_abandon,
    reconciliation_accept_terminal,
    reconciliation_attach_remote_id,
    reconciliation_declare_never_created,
    reconciliation_take,
)

RESOLVE_PERMISSION = "ledger.resolve_reconciliationitem"


class QueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("open", "Open"), ("overdue", "Overdue"), ("resolved", "Resolved")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "open":
            return queryset.filter(status=ReconciliationItem.Status.OPEN)
        if self.value() == "overdue":
            return queryset.filter(status=ReconciliationItem.Status.OPEN, deadline__lt=timezone.now())
        if self.value() == "resolved":
            return queryset.filter(status=ReconciliationItem.Status.RESOLVED)
        return queryset


class ReasonForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
                             help_text="Why: recorded with your user name.")


class AttachForm(ReasonForm):
    remote_id = forms.CharField(max_length=300, help_text="The task id found by hand.")


class AcceptForm(ReasonForm):
    terminal_status = forms.ChoiceField(choices=TerminalStatus.choices)
    evidence = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 5, "cols": 60}),
        help_text="JSON object: the result as observed (may be empty if a result was fetched).",
    )

    def clean_evidence(self) -> dict[str, Any] | None:
        return form_json_object(self.cleaned_data["evidence"])


@dataclass(frozen=True)
class Resolution:
    title: str
    explanation: str
    form_class: type[forms.Form]
    service: Callable[[int, dict[str, Any], Any], object]


RESOLUTIONS: dict[str, Resolution] = {
    "attach_remote_id": Resolution(
        "Attach remote id",
        "The row goes back to WORKING with this id and normal polling resumes.", AttachForm,
        lambda item_id, data, actor: reconciliation_attach_remote_id(
            item_id=item_id, remote_id=data["remote_id"], actor=actor, reason=data["reason"])),
    "declare_never_created": Resolution(
        "Declare never created",
        "NOT_FOUND_SAFE: a new attempt may then be submitted for the call node.", ReasonForm,
        lambda item_id, data, actor: reconciliation_declare_never_created(
            item_id=item_id, actor=actor, reason=data["reason"])),
    "accept_terminal": Resolution(
        "Accept terminal state",
        "The evidence is stored and digested as the result, then accepted. The operation will show "
        "the server state as not observed, with what you attested.", AcceptForm,
        lambda item_id, data, actor: reconciliation_accept_terminal(
            item_id=item_id, terminal_status=data["terminal_status"], evidence=data["evidence"],
            actor=actor, reason=data["reason"])),
    "abandon": Resolution(
        "Close as abandoned",
        "ABANDONED: the call node stays taken (its remote work may still exist).", ReasonForm,
        lambda item_id, data, actor: reconciliation_abandon(
            item_id=item_id, actor=actor, reason=data["reason"])),
}


class ReconciliationItemAdmin(OperationColumns, admin.ModelAdmin):
    # Narrow enough for 1400 px: ids cut short (whole in the tooltip), the age in place of the date.
    list_display = ("item", "age", "reason", "operation_short", "call_node", "server", "tool",
                    "remote", "due", "owner", "outcome")
    list_display_links = ("item",)
    list_filter = (QueueFilter, "reason", "status", "resolution", "operation__server")
    list_select_related = ("operation__server", "owner")
    date_hierarchy = "created_at"
    search_fields = ("=operation__id", "^operation__remote_id", "=operation__submission_key",
                     "^operation__call_node_id", "=operation__server__name", "=operation__tool_name")
    search_help_text = ("Operation id or submission key (exact), remote id or call node (prefix), "
                        "server or tool name (exact).")
    fields = ("operation_page", "reason", "evidence_pretty", "deadline", "owner", "status",
              "resolution", "resolution_reason", "resolved_by", "resolved_at", "created_at")
    readonly_fields = fields
    ordering = ("deadline",)
    change_form_template = "admin/ledger/reconciliationitem/change_form.html"
    actions = ["take_ownership", "attach_remote_id", "declare_never_created", "accept_terminal",
               "abandon"]

    class Media:
        css = {"all": ["toolops/admin.css"]}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # changes only through the resolutions (services), never a raw form

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_resolve_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(RESOLVE_PERMISSION))

    # --- list columns, narrow enough for 1400 px ---

    @admin.display(description="item", ordering="id")
    def item(self, obj: ReconciliationItem) -> str:
        return f"#{obj.pk}"

    @admin.display(description="age", ordering="created_at")
    def age(self, obj: ReconciliationItem) -> str:
        return format_html('<span title="opened {}">{}</span>',
                           obj.created_at.strftime("%Y-%m-%d %H:%M:%S UTC"), age(obj.created_at))

    @admin.display(description="operation")
    def operation_short(self, obj: ReconciliationItem) -> str:
        return operation_link(obj.operation_id)

    @admin.display(description="call node", ordering="operation__call_node_id")
    def call_node(self, obj: ReconciliationItem) -> str:
        return truncated(obj.operation.call_node_id, width=20)

    @admin.display(description="remote id", ordering="operation__remote_id")
    def remote(self, obj: ReconciliationItem) -> str:
        return truncated(obj.operation.remote_id, width=16)

    @admin.display(description="deadline", ordering="deadline")
    def due(self, obj: ReconciliationItem) -> str:
        if obj.status != ReconciliationItem.Status.OPEN:
            return "-"
        if obj.deadline < timezone.now():
            return format_html('<strong style="color:var(--error-fg,#ba2121)">overdue {}</strong>',
                               age(obj.deadline))
        return f"in {duration((obj.deadline - timezone.now()).total_seconds())}"

    @admin.display(description="outcome", ordering="status")
    def outcome(self, obj: ReconciliationItem) -> str:
        if obj.status == ReconciliationItem.Status.OPEN:
            return "open"
        return f"{obj.resolution} by {obj.resolved_by}"

    @admin.display(description="operation")
    def operation_page(self, obj: ReconciliationItem) -> str:
        op = obj.operation
        return format_html("{} — {} on {} / {}, state {}, remote id {}",
                           operation_link(op.id, short=False), op.call_node_id, op.server.name,
                           op.tool_name, op.state, op.remote_id or "-")

    @admin.display(description="evidence")
    def evidence_pretty(self, obj: ReconciliationItem) -> str:
        return pretty_json(obj.evidence)

    # --- resolution, from the list or the item's page ---

    def _resolve(self, request: HttpRequest, items: list[ReconciliationItem], name: str,
                 *, back_url: str) -> HttpResponse | None:
        """Ask, then resolve each item. None when done (the caller redirects); a page otherwise."""
        spec = RESOLUTIONS[name]
        form = spec.form_class(request.POST if "apply" in request.POST else None)
        errors: list[str] = []
        if "apply" in request.POST and form.is_valid():
            actor = actor_for_user(user=request.user)  # the services check its permission again
            refused: list[ReconciliationItem] = []
            for item in items:
                try:
                    spec.service(item.pk, form.cleaned_data, actor)
                except (ReconciliationRefused, PermissionRefused) as exc:
                    refused.append(item)
                    errors.append(f"item {item.pk}: {exc}")
                else:
                    note = f"{name}: {form.cleaned_data['reason']}"
                    self.log_change(request, item, note)
                    self.log_change(request, item.operation, f"reconciliation item {item.pk} {note}")
            done = len(items) - len(refused)
            if done:
                self.message_user(request, f"{spec.title}: {done} item(s) resolved.", messages.SUCCESS)
            if not refused:
                return None
            items = refused  # re-ask for the refused ones only, keeping what was typed
        return TemplateResponse(request, "admin/toolops/reconciliation_action.html", {
            **self.admin_site.each_context(request), "title": spec.title,
            "explanation": spec.explanation, "items": items, "form": form, "action": name,
            "errors": errors, "opts": self.model._meta, "back_url": back_url,
            "from_list": "_selected_action" in request.POST,
        })

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("<int:pk>/resolve/<slug:name>/", wrap(self.resolve_view),
                 name="ledger_reconciliationitem_resolve"),
            path("<int:pk>/take/", wrap(self.take_view), name="ledger_reconciliationitem_take"),
            *super().get_urls(),
        ]

    def _item_for_action(self, request: HttpRequest, pk: int) -> ReconciliationItem:
        if not self.has_resolve_permission(request):
            raise PermissionDenied("resolving reconciliation items needs " + RESOLVE_PERMISSION)
        return get_object_or_404(self.get_queryset(request), pk=pk)

    def resolve_view(self, request: HttpRequest, pk: int, name: str) -> HttpResponse:
        if name not in RESOLUTIONS:
            raise Http404(f"no resolution {name!r}")
        item = self._item_for_action(request, pk)
        page = reverse("admin:ledger_reconciliationitem_change", args=[pk])
        response = self._resolve(request, [item], name, back_url=page)
        return response if response is not None else HttpResponseRedirect(page)

    def take_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        item = self._item_for_action(request, pk)
        taken = self._take(request, item) if request.method == "POST" else None
        if taken:
            self.message_user(request, f"Item {pk} is now owned by {request.user.get_username()}.")
        elif taken is False:
            self.message_user(request, f"Item {pk} is resolved; its owner stays.", messages.WARNING)
        return HttpResponseRedirect(reverse("admin:ledger_reconciliationitem_change", args=[pk]))

    def _take(self, request: HttpRequest, item: ReconciliationItem) -> bool | None:
        """True when taken, False when the item is resolved, None when refused (message shown)."""
        user_id = request.user.pk
        assert user_id is not None  # admin views require a logged-in user
        try:
            taken = reconciliation_take(item_id=item.pk, user_id=user_id,
                                        actor=actor_for_user(user=request.user))
        except (ReconciliationRefused, PermissionRefused) as exc:
            self.message_user(request, f"item {item.pk}: {exc}", messages.ERROR)
            return None
        if taken:
            self.log_change(request, item, "took ownership")
        return taken

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        item = self.get_object(request, object_id)
        can = (item is not None and item.status == ReconciliationItem.Status.OPEN
               and self.has_resolve_permission(request))
        context = {**(extra_context or {}), "can_resolve": can,
                   "resolutions": [(name, spec.title) for name, spec in RESOLUTIONS.items()]}
        return super().change_view(request, object_id, form_url, context)

    @admin.action(description="Take ownership", permissions=["resolve"])
    def take_ownership(self, request: HttpRequest,
                       queryset: QuerySet[ReconciliationItem]) -> None:
        taken = sum(1 for item in queryset if self._take(request, item))
        self.message_user(request, f"{taken} open item(s) now owned by {request.user.get_username()}.")

    def _list_action(self, request: HttpRequest, queryset: QuerySet[ReconciliationItem],
                     name: str) -> HttpResponse | None:
        back = reverse("admin:ledger_reconciliationitem_changelist")
        return self._resolve(request, list(queryset), name, back_url=back)

    @admin.action(description="Attach a remote id found by hand", permissions=["resolve"])
    def attach_remote_id(self, request: HttpRequest,
                         queryset: QuerySet[ReconciliationItem]) -> HttpResponse | None:
        return self._list_action(request, queryset, "attach_remote_id")

    @admin.action(description="Declare never created (allows resubmission)", permissions=["resolve"])
    def declare_never_created(self, request: HttpRequest,
                              queryset: QuerySet[ReconciliationItem]) -> HttpResponse | None:
        return self._list_action(request, queryset, "declare_never_created")

    @admin.action(description="Accept an observed terminal state", permissions=["resolve"])
    def accept_terminal(self, request: HttpRequest,
                        queryset: QuerySet[ReconciliationItem]) -> HttpResponse | None:
        return self._list_action(request, queryset, "accept_terminal")

    @admin.action(description="Close as abandoned", permissions=["resolve"])
    def abandon(self, request: HttpRequest,
                queryset: QuerySet[ReconciliationItem]) -> HttpResponse | None:
        return self._list_action(request, queryset, "abandon")


admin.site.register(ReconciliationItem, ReconciliationItemAdmin)
