"""The manual reconciliation queue in Django admin.

Items are read-only here. Each action asks for a reason (and what it needs) on an intermediate
page, then calls ONE service per selected item; the services lock, check and record who and why.
Actions need the `ledger.resolve_reconciliationitem` permission, viewing needs view permission.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from ledger.models import ReconciliationItem
from ledger.states import TerminalStatus
from toolops.admin_forms import form_json_object
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


Service = Callable[[ReconciliationItem, dict[str, Any], Any], object]


class ReconciliationItemAdmin(admin.ModelAdmin):
    list_display = ("id", "reason", "operation_state", "remote_id", "deadline", "overdue", "owner",
                    "status", "resolution", "resolved_by")
    list_filter = (QueueFilter, "reason", "status")
    # Found by remote (task) id or by submission key, like `toolops show`.
    search_fields = ("=operation__remote_id", "=operation__submission_key", "operation__call_node_id")
    readonly_fields = ("operation", "reason", "evidence", "deadline", "owner", "status", "resolution",
                       "resolution_reason", "resolved_by", "resolved_at", "created_at")
    ordering = ("deadline",)
    actions = ["take_ownership", "attach_remote_id", "declare_never_created", "accept_terminal",
               "abandon"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[ReconciliationItem]:
        return super().get_queryset(request).select_related("operation", "owner")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # changes only through the actions (services), never a raw form

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_resolve_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(RESOLVE_PERMISSION))

    @admin.display(description="operation state")
    def operation_state(self, obj: ReconciliationItem) -> str:
        return obj.operation.state

    @admin.display(description="remote id")
    def remote_id(self, obj: ReconciliationItem) -> str:
        return obj.operation.remote_id or "-"

    @admin.display(boolean=True, description="overdue")
    def overdue(self, obj: ReconciliationItem) -> bool:
        return obj.status == ReconciliationItem.Status.OPEN and obj.deadline < timezone.now()

    def _run(
        self, request: HttpRequest, queryset: QuerySet[ReconciliationItem], *, action: str,
        title: str, explanation: str, form_class: type[forms.Form], service: Service,
    ) -> HttpResponse | None:
        items = list(queryset)
        form = form_class(request.POST if "apply" in request.POST else None)
        if "apply" not in request.POST or not form.is_valid():
            return TemplateResponse(request, "admin/toolops/reconciliation_action.html", {
                **self.admin_site.each_context(request), "title": title, "explanation": explanation,
                "items": items, "form": form, "action": action, "opts": self.model._meta,
            })
        actor = actor_for_user(user=request.user)  # the services check its permission again
        done = 0
        for item in items:
            try:
                service(item, form.cleaned_data, actor)
                done += 1
            except (ReconciliationRefused, PermissionRefused) as exc:
                self.message_user(request, f"item {item.id}: {exc}", level=messages.ERROR)
        if done:
            self.message_user(request, f"{title}: {done} item(s) resolved.", level=messages.SUCCESS)
        return None

    @admin.action(description="Take ownership", permissions=["resolve"])
    def take_ownership(self, request: HttpRequest,
                       queryset: QuerySet[ReconciliationItem]) -> None:
        user_id = request.user.pk
        assert user_id is not None  # admin views require a logged-in user
        taken = sum(reconciliation_take(item_id=item.id, user_id=user_id) for item in queryset)
        self.message_user(request, f"{taken} open item(s) now owned by {request.user.get_username()}.")

    @admin.action(description="Attach a remote id found by hand", permissions=["resolve"])
    def attach_remote_id(self, request: HttpRequest,
                         queryset: QuerySet[ReconciliationItem]) -> HttpResponse | None:
        return self._run(
            request, queryset, action="attach_remote_id", title="Attach remote id",
            explanation="The row goes back to WORKING with this id and normal polling resumes.",
            form_class=AttachForm,
            service=lambda item, data, actor: reconciliation_attach_remote_id(
                item_id=item.id, remote_id=data["remote_id"], actor=actor, reason=data["reason"]),
        )

    @admin.action(description="Declare never created (allows resubmission)", permissions=["resolve"])
    def declare_never_created(self, request: HttpRequest,
                              queryset: QuerySet[ReconciliationItem]) -> HttpResponse | None:
        return self._run(
            request, queryset, action="declare_never_created", title="Declare never created",
            explanation="NOT_FOUND_SAFE: a new attempt may then be submitted for the call node.",
            form_class=ReasonForm,
            service=lambda item, data, actor: reconciliation_declare_never_created(
                item_id=item.id, actor=actor, reason=data["reason"]),
        )

    @admin.action(description="Accept an observed terminal state", permissions=["resolve"])
    def accept_terminal(self, request: HttpRequest,
                        queryset: QuerySet[ReconciliationItem]) -> HttpResponse | None:
        return self._run(
            request, queryset, action="accept_terminal", title="Accept terminal state",
            explanation="The evidence is stored and digested as the result, then accepted.",
            form_class=AcceptForm,
            service=lambda item, data, actor: reconciliation_accept_terminal(
                item_id=item.id, terminal_status=data["terminal_status"],
                evidence=data["evidence"], actor=actor, reason=data["reason"]),
        )

    @admin.action(description="Close as abandoned", permissions=["resolve"])
    def abandon(self, request: HttpRequest,
                queryset: QuerySet[ReconciliationItem]) -> HttpResponse | None:
        return self._run(
            request, queryset, action="abandon", title="Close as abandoned",
            explanation="ABANDONED: the call node stays taken (its remote work may still exist).",
            form_class=ReasonForm,
            service=lambda item, data, actor: reconciliation_abandon(
                item_id=item.id, actor=actor, reason=data["reason"]),
        )


admin.site.register(ReconciliationItem, ReconciliationItemAdmin)
