"""The human gate for input rounds, and the late-effect records, in Django admin.

Ledger rows stay read-only here: the answer form calls `operation_answer_input`, which checks the
round, the schema digest and the deadline under the row lock and delivers the answer. Answering
needs the `ledger.change_inputrequest` permission; viewing needs the view permission.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from ledger.models import EffectReconciliation, InputRequest
from toolops.admin_forms import form_json_object
from toolops.services.inputs import ELICITATION_ACTIONS, InputAnswerRefused, operation_answer_input
from toolops.services.permissions import PermissionRefused, actor_for_user

ANSWER_PERMISSION = "ledger.change_inputrequest"


class InputAnswerForm(forms.Form):
    # The digest and round the operator saw when the page was rendered: if the open request changed
    # since, the service refuses the answer as stale instead of answering a question not shown.
    input_round = forms.IntegerField(widget=forms.HiddenInput)
    schema_digest = forms.CharField(widget=forms.HiddenInput)
    action = forms.ChoiceField(choices=[(a, a) for a in sorted(ELICITATION_ACTIONS)],
                               initial="accept")
    content = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6, "cols": 60}), required=False,
        help_text="JSON object matching the requested schema (for accept)",
    )

    def clean_content(self) -> Any:
        return form_json_object(self.cleaned_data["content"])


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # no raw edit form; answers go through the service only

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class OpenFirstFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(s.value, str(s.label)) for s in InputRequest.Status] + [("all", "All")]

    def choices(self, changelist: Any) -> Any:
        for lookup, title in self.lookup_choices:
            yield {"selected": (self.value() or "open") == lookup,
                   "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                   "display": title}

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value() or "open"  # the gate's default view: what still needs an answer
        return queryset if value == "all" else queryset.filter(status=value)


@admin.register(InputRequest)
class InputRequestAdmin(_ReadOnly):
    list_display = ("answer_link", "question", "round", "status", "deadline", "operation_link",
                    "method")
    list_filter = (OpenFirstFilter, "method")
    search_fields = ("=operation__id", "=operation__remote_id", "operation__call_node_id")
    ordering = ("deadline",)
    readonly_fields = ("operation", "round", "server_request_id", "method", "params",
                       "schema_digest", "deadline", "status", "answer", "answered_by",
                       "answered_at", "delivered_at", "created_at")

    @admin.display(description="operation")
    def operation_link(self, obj: InputRequest) -> str:
        url = reverse("admin:ledger_operation_change", args=[obj.operation_id])
        # Short form in the list; the full id is on the operation page and in search.
        return format_html('<a href="{}" title="{}">{}…</a>', url, obj.operation_id,
                           str(obj.operation_id)[:8])

    @admin.display(description="question")
    def question(self, obj: InputRequest) -> str:
        return str(obj.params.get("message", ""))[:120]

    @admin.display(description="answer")
    def answer_link(self, obj: InputRequest) -> str:
        if obj.status != InputRequest.Status.OPEN:
            return "-"
        url = reverse("admin:ledger_inputrequest_answer", args=[obj.pk])
        return format_html('<a href="{}">answer</a>', url)

    def get_urls(self) -> list[URLPattern]:
        answer = path("<int:pk>/answer/", self.admin_site.admin_view(self.answer_view),
                      name="ledger_inputrequest_answer")
        return [answer, *super().get_urls()]

    def answer_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        if not request.user.has_perm(ANSWER_PERMISSION):
            raise PermissionDenied("answering input requests needs " + ANSWER_PERMISSION)
        ir = get_object_or_404(InputRequest.objects.select_related("operation"), pk=pk)
        initial = {"input_round": ir.round, "schema_digest": ir.schema_digest}
        form = InputAnswerForm(request.POST or None, initial=initial)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            response: dict[str, Any] = {"action": data["action"]}
            if data["content"] is not None:
                response["content"] = data["content"]
            try:
                operation_answer_input(
                    operation_id=ir.operation_id, input_round=data["input_round"],
                    schema_digest=data["schema_digest"], response=response,
                    answered_by_id=request.user.pk, actor=actor_for_user(user=request.user),
                )
            except (InputAnswerRefused, PermissionRefused) as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(request, f"round {ir.round} of {ir.operation_id} answered")
                return HttpResponseRedirect(reverse("admin:ledger_inputrequest_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Answer input round {ir.round}",
            "opts": self.model._meta,
            "input_request": ir,
            "requested_schema": json.dumps(ir.params.get("requestedSchema"), indent=2),
            "form": form,
        }
        return TemplateResponse(request, "toolops/input_answer.html", context)


@admin.register(EffectReconciliation)
class EffectReconciliationAdmin(_ReadOnly):
    """EFFECT_RECONCILIATION_REQUIRED: completions seen after an accepted cancel."""

    list_display = ("operation", "observed_status", "source", "created_at", "resolved_at")
    list_filter = ("observed_status", "source")
    search_fields = ("=operation__id", "=operation__remote_id")
    ordering = ("-created_at",)
