"""REST views: thin. Each resolves the tenant, validates input, and calls one toolops.python_api function
(or one selector for reads). Every queryset is filtered by the request's tenant, so another
tenant's objects are indistinguishable from missing ones (404)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from ledger.models import InputRequest, Operation, ReconciliationItem, ToolServer
from toolops import python_api as api
from toolops.logging import get_logger, operation_log_context_for
from toolops.metrics import api_submission_inc
from toolops.rest import serializers as s
from toolops.rest.tenancy import request_tenant
from toolops.services.permissions import actor_for_user

logger = get_logger("toolops.api")

IDEMPOTENCY_HEADER = OpenApiParameter(
    name="Idempotency-Key", type=OpenApiTypes.STR, location=OpenApiParameter.HEADER, required=False,
    description="The submission key. Same key and body: the existing operation (200). Same key, "
                "different body: 422. First request with this key still sending: 409.",
)
ERROR = OpenApiResponse(description="Refused; `detail` says why.")


class OperationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Operations of the caller's organisation."""

    serializer_class = s.OperationSerializer
    lookup_value_regex = "[0-9a-fA-F-]{36}"

    def get_queryset(self) -> QuerySet[Operation]:
        if getattr(self, "swagger_fake_view", False):  # schema generation: no request
            return Operation.objects.none()
        qs = Operation.objects.filter(tenant=request_tenant(self.request)).select_related("server")
        if self.action == "list":
            flt = s.OperationFilterSerializer(data=self.request.query_params)
            flt.is_valid(raise_exception=True)
            if "state" in flt.validated_data:
                qs = qs.filter(state=flt.validated_data["state"])
            if "call_node_id" in flt.validated_data:
                qs = qs.filter(call_node_id=flt.validated_data["call_node_id"])
        return qs.order_by("-created_at", "id")

    def get_serializer_class(self) -> Any:
        return s.OperationDetailSerializer if self.action == "retrieve" else s.OperationSerializer

    @extend_schema(parameters=[s.OperationFilterSerializer])
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(
        request=s.SubmitSerializer, parameters=[IDEMPOTENCY_HEADER],
        responses={201: s.OperationSerializer, 200: s.OperationSerializer, 400: ERROR, 403: ERROR,
                   409: ERROR, 422: ERROR},
    )
    def create(self, request: Request) -> Response:
        """Submit a call (the row is committed before anything is sent)."""
        body = s.SubmitSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        key = request.headers.get("Idempotency-Key")
        try:
            view, created = _submit(tenant=request_tenant(request), key=key, data=data,
                                    actor=actor_for_user(user=request.user))
        except Exception as exc:
            api_submission_inc(outcome=type(exc).__name__)
            raise
        api_submission_inc(outcome="created" if created else "replayed")
        op = Operation.objects.select_related("server").get(id=view.id)
        with operation_log_context_for(op):
            logger.info("api submission", created=created, state=op.state)
        return Response(s.OperationSerializer(op).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(request=s.CancelSerializer,
                   responses={202: s.OperationSerializer, 403: ERROR, 404: ERROR, 409: ERROR})
    @action(detail=True, methods=["post"], url_path="cancel")
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        body = s.CancelSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        op = self.get_object()
        api.cancel_operation(operation_id=op.id, tenant=request_tenant(request),
                             actor=actor_for_user(user=request.user))
        op.refresh_from_db()
        return Response(s.OperationSerializer(op).data, status=status.HTTP_202_ACCEPTED)


def _submit(*, tenant: str, key: str | None, data: dict[str, Any],
            actor: api.Actor) -> tuple[api.OperationView, bool]:
    # The public API returns a view; `created` comes from the idempotency service it wraps.
    from toolops.services.idempotency import operation_submit_idempotent

    op, created = operation_submit_idempotent(
        tenant=tenant, idempotency_key=key, server_name=data["server"], tool_name=data["tool"],
        call_node_id=data["call_node_id"], arguments=data["arguments"], ttl_ms=data.get("ttl_ms"),
        actor=actor,
    )
    return api.get_operation(operation_id=op.id, tenant=tenant), created


class InputRequestViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Open input rounds of the caller's organisation's operations."""

    serializer_class = s.InputRequestSerializer
    lookup_value_regex = "[0-9]+"

    def get_queryset(self) -> QuerySet[InputRequest]:
        if getattr(self, "swagger_fake_view", False):  # schema generation: no request
            return InputRequest.objects.none()
        return InputRequest.objects.filter(
            operation__tenant=request_tenant(self.request), status=InputRequest.Status.OPEN
        ).order_by("deadline", "id")

    @extend_schema(request=s.AnswerSerializer,
                   responses={202: s.OperationSerializer, 403: ERROR, 404: ERROR, 409: ERROR})
    @action(detail=True, methods=["post"], url_path="answer")
    def answer(self, request: Request, pk: str | None = None) -> Response:
        body = s.AnswerSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        item = self.get_object()
        view = api.answer_input(
            operation_id=item.operation_id, input_round=item.round,
            schema_digest=body.validated_data["schema_digest"],
            response=body.validated_data["response"], tenant=request_tenant(request),
            actor=actor_for_user(user=request.user),
        )
        op = Operation.objects.select_related("server").get(id=view.id)
        return Response(s.OperationSerializer(op).data, status=status.HTTP_202_ACCEPTED)


class ReconciliationViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Reconciliation items of the caller's organisation's operations."""

    serializer_class = s.ReconciliationItemSerializer
    lookup_value_regex = "[0-9]+"

    def get_queryset(self) -> QuerySet[ReconciliationItem]:
        if getattr(self, "swagger_fake_view", False):  # schema generation: no request
            return ReconciliationItem.objects.none()
        return ReconciliationItem.objects.filter(
            operation__tenant=request_tenant(self.request)
        ).order_by("status", "deadline", "id")

    @extend_schema(request=s.ResolveSerializer,
                   responses={200: s.ReconciliationItemSerializer, 403: ERROR, 404: ERROR, 409: ERROR,
                              422: ERROR})
    @action(detail=True, methods=["post"], url_path="resolve")
    def resolve(self, request: Request, pk: str | None = None) -> Response:
        body = s.ResolveSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        item = self.get_object()
        api.resolve_reconciliation_item(
            item_id=item.pk, action=body.validated_data["resolution"],
            reason=body.validated_data["reason"], evidence=body.validated_data["evidence"],
            remote_id=body.validated_data.get("remote_id", ""),
            terminal_status=body.validated_data.get("terminal_status", ""),
            actor=actor_for_user(user=request.user), tenant=request_tenant(request),
        )
        item.refresh_from_db()
        return Response(s.ReconciliationItemSerializer(item).data)


class ServerViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Tool servers the caller may submit to: its organisation's and the shared ones."""

    serializer_class = s.ServerSerializer
    lookup_field = "name"
    lookup_value_regex = "[-a-zA-Z0-9_]+"

    def get_queryset(self) -> QuerySet[ToolServer]:
        if getattr(self, "swagger_fake_view", False):  # schema generation: no request
            return ToolServer.objects.none()
        return ToolServer.objects.filter(tenant__in=("", request_tenant(self.request))).order_by("name")
