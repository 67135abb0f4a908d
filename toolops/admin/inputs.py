"""The human gate for input rounds, and the late-effect records, in Django admin.

Ledger rows stay read-only here: the answer form calls `operation_answer_input`, which checks the
round, the schema digest and the deadline under the row lock and delivers the answer. A refused
answer re-renders the form with the reason and what was typed; decline and cancel ask for
confirmation first; every answer goes to admin's history (LogEntry). Answering needs the
`ledger.change_inputrequest` permission (users without it see no answer links); viewing needs the
view permission.
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
from django.utils import timezone
from django.utils.html import format_html

from ledger.admin import OperationColumns, ReadOnlyAdmin
from ledger.admin import operation_link as link_to_operation
from ledger.models import EffectReconciliation, InputRequest
from toolops.admin.forms import form_json_object
from toolops.admin.operations import age, duration, pretty_json
from toolops.services.answer_checks import ELICITATION_ACTIONS, InputAnswerRefused
from toolops.services.inputs import operation_answer_input
from toolops.services.permissions import PermissionRefused, actor_for_user

ANSWER_PERMISSION = "ledger.change_inputrequest"
# Answers that end the elicitation without content: asked twice, because they cannot be taken back.
CONFIRMED_ACTIONS = frozenset({"decline", "cancel"})


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
class InputRequestAdmin(OperationColumns, ReadOnlyAdmin):
    # Narrow enough for 1400 px: ages instead of dates (the dates are in the tooltips).
    list_display = ("answer_link", "question", "round", "status", "asked", "due", "operation_link",
                    "server", "tool", "answered")
    list_filter = (OpenFirstFilter, "method", "operation__server")
    list_select_related = ("operation__server", "answered_by")
    date_hierarchy = "created_at"
    search_fields = ("=operation__id", "^operation__remote_id", "^operation__call_node_id",
                     "=operation__server__name", "=operation__tool_name")
    search_help_text = ("Operation id (exact), remote id or call node (prefix), server or tool name "
                        "(exact).")
    ordering = ("deadline",)
    fields = ("operation_page", "round", "status", "method", "question", "params_pretty",
              "schema_digest", "deadline", "answer_pretty", "answered", "answered_at",
              "delivered_at", "server_request_id", "created_at")
    readonly_fields = fields
    change_form_template = "admin/ledger/inputrequest/change_form.html"

    class Media:
        css = {"all": ["toolops/admin.css"]}

    def get_list_display(self, request: HttpRequest) -> Any:
        # A view-only user is shown no "answer" link that would end in a 403 page.
        if request.user.has_perm(ANSWER_PERMISSION):
            return self.list_display
        return self.list_display[1:]

    @admin.display(description="operation")
    def operation_link(self, obj: InputRequest) -> str:
        return link_to_operation(obj.operation_id)

    @admin.display(description="operation")
    def operation_page(self, obj: InputRequest) -> str:
        op = obj.operation
        return format_html("{} — {} on {} / {}, state {}", link_to_operation(op.id, short=False),
                           op.call_node_id, op.server.name, op.tool_name, op.state)

    @admin.display(description="asked", ordering="created_at")
    def asked(self, obj: InputRequest) -> str:
        return format_html('<span title="{}">{} ago</span>',
                           obj.created_at.strftime("%Y-%m-%d %H:%M:%S UTC"), age(obj.created_at))

    @admin.display(description="deadline", ordering="deadline")
    def due(self, obj: InputRequest) -> str:
        left = (obj.deadline - timezone.now()).total_seconds()
        if obj.status != InputRequest.Status.OPEN:
            return "-"
        when = obj.deadline.strftime("%Y-%m-%d %H:%M:%S UTC")
        if left < 0:
            return format_html('<strong title="{}">passed</strong>', when)
        return format_html('<span title="{}">in {}</span>', when, duration(left))

    @admin.display(description="question")
    def question(self, obj: InputRequest) -> str:
        return str(obj.params.get("message", ""))[:120]

    @admin.display(description="answered by")
    def answered(self, obj: InputRequest) -> str:
        if obj.answered_by is None:
            return "-"
        action = obj.answer.get("action", "accept") if isinstance(obj.answer, dict) else "accept"
        return f"{obj.answered_by.get_username()} ({action})"

    @admin.display(description="request")
    def params_pretty(self, obj: InputRequest) -> str:
        return pretty_json(obj.params)

    @admin.display(description="answer")
    def answer_pretty(self, obj: InputRequest) -> str:
        return pretty_json(obj.answer)

    @admin.display(description="answer")
    def answer_link(self, obj: InputRequest) -> str:
        if obj.status != InputRequest.Status.OPEN:
            return "-"
        url = reverse("admin:ledger_inputrequest_answer", args=[obj.pk])
        return format_html('<a href="{}">answer</a>', url)

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        ir = self.get_object(request, object_id)
        can = (ir is not None and ir.status == InputRequest.Status.OPEN
               and request.user.has_perm(ANSWER_PERMISSION))
        return super().change_view(request, object_id, form_url,
                                   {**(extra_context or {}), "can_answer": can})

    def get_urls(self) -> list[URLPattern]:
        answer = path("<int:pk>/answer/", self.admin_site.admin_view(self.answer_view),
                      name="ledger_inputrequest_answer")
        return [answer, *super().get_urls()]

    def answer_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        if not request.user.has_perm(ANSWER_PERMISSION):
            raise PermissionDenied("answering input requests needs " + ANSWER_PERMISSION)
        ir = get_object_or_404(InputRequest.objects.select_related("operation__server"), pk=pk)
        initial = {"input_round": ir.round, "schema_digest": ir.schema_digest}
        form = InputAnswerForm(request.POST or None, initial=initial)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            if data["action"] in CONFIRMED_ACTIONS and "confirm" not in request.POST:
                return self._confirm(request, ir, form)
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
                note = f"answered round {ir.round}: {data['action']}"
                self.log_change(request, ir, note)
                self.log_change(request, ir.operation, note)
                messages.success(request, f"Round {ir.round} of {ir.operation_id} answered "
                                          f"({data['action']}).")
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

    def _confirm(self, request: HttpRequest, ir: InputRequest, form: InputAnswerForm) -> HttpResponse:
        action = form.cleaned_data["action"]
        op = ir.operation
        effect = ("The server is told the user declined to answer; the tool decides what follows."
                  if action == "decline" else
                  "The server is told the user cancelled the question; the tool may end the call.")
        hidden = [(name, form.data.get(name, "")) for name in
                  ("input_round", "schema_digest", "action", "content")]
        return TemplateResponse(request, "admin/toolops/confirm.html", {
            **self.admin_site.each_context(request),
            "title": f"{action.capitalize()} input round {ir.round}?", "opts": self.model._meta,
            "object": ir, "error": "", "explanation": effect + " This cannot be taken back.",
            "back_url": reverse("admin:ledger_inputrequest_answer", args=[ir.pk]),
            "confirm_label": f"Yes, {action}", "hidden": hidden,
            "details": [("operation", str(op.id)), ("server / tool", f"{op.server.name} / {op.tool_name}"),
                        ("round", str(ir.round)), ("question", str(ir.params.get("message", "")))],
        })


@admin.register(EffectReconciliation)
class EffectReconciliationAdmin(OperationColumns, ReadOnlyAdmin):
    """EFFECT_RECONCILIATION_REQUIRED: completions seen after an accepted cancel."""

    list_display = ("id", "created_at", "operation_link", "server", "tool", "observed_status",
                    "source", "resolved_at")
    list_filter = ("observed_status", "source", "operation__server")
    list_select_related = ("operation__server",)
    date_hierarchy = "created_at"
    search_fields = ("=operation__id", "^operation__remote_id", "=operation__server__name",
                     "=operation__tool_name")
    search_help_text = "Operation id (exact), remote id (prefix), server or tool name (exact)."
    readonly_fields = ("operation", "observed_status", "source", "evidence_pretty", "resolved_at",
                       "note", "created_at")
    exclude = ("evidence",)

    @admin.display(description="operation")
    def operation_link(self, obj: EffectReconciliation) -> str:
        return link_to_operation(obj.operation_id)

    @admin.display(description="evidence")
    def evidence_pretty(self, obj: EffectReconciliation) -> str:
        return pretty_json(obj.evidence)
    ordering = ("-created_at",)
