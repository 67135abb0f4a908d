"""Request and response shapes (these also define the OpenAPI schema)."""

from __future__ import annotations

import json
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ledger.models import (
    InputRequest,
    Operation,
    OperationEvent,
    OutboxEvent,
    ReconciliationItem,
    TerminalReceipt,
    ToolServer,
)
from ledger.states import State, TerminalStatus
from toolops.services.url_policy import url_without_credentials

# Arguments larger than this are refused before anything is written (a tool call, not an upload).
MAX_ARGUMENTS_BYTES = 256 * 1024
# Deeper nesting than this is refused: it is never a real tool argument and costs stack to walk.
MAX_ARGUMENTS_DEPTH = 32
# The ledger column is a PositiveBigIntegerField; a day-sized cap keeps requested ttls sane.
MAX_TTL_MS = 30 * 24 * 3600 * 1000
# I-JSON (RFC 7493) integer range: what RFC 8785 canonical digests (ledger/digests.py) can represent.
MAX_SAFE_INTEGER = 2**53 - 1


def _check_json(value: Any, depth: int = 0) -> None:
    if depth > MAX_ARGUMENTS_DEPTH:
        raise serializers.ValidationError(f"nested deeper than {MAX_ARGUMENTS_DEPTH} levels")
    if isinstance(value, str):
        # PostgreSQL text and jsonb cannot store U+0000.
        if "\x00" in value:
            raise serializers.ValidationError("strings may not contain U+0000")
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SAFE_INTEGER:
        raise serializers.ValidationError(
            f"integers must be within +/-{MAX_SAFE_INTEGER} (I-JSON, RFC 7493); send larger ones as strings"
        )
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_json(k, depth + 1)
            _check_json(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _check_json(v, depth + 1)


class JSONObjectField(serializers.DictField):
    """A JSON object of arbitrary values that PostgreSQL jsonb can store."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(child=serializers.JSONField(), **kwargs)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        value = super().to_internal_value(data)
        _check_json(value)
        if len(json.dumps(value)) > MAX_ARGUMENTS_BYTES:
            raise serializers.ValidationError(f"larger than {MAX_ARGUMENTS_BYTES} bytes")
        return value


class SubmitSerializer(serializers.Serializer):
    server = serializers.SlugField(max_length=100)
    tool = serializers.CharField(max_length=200)
    call_node_id = serializers.CharField(max_length=200)
    arguments = JSONObjectField(required=False, default=dict)
    ttl_ms = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=MAX_TTL_MS)


class ReceiptSerializer(serializers.ModelSerializer):
    class Meta:
        model = TerminalReceipt
        fields = ["id", "call_node_id", "execution_epoch", "terminal_status", "request_digest",
                  "remote_id", "descriptor_version", "cancel_generation", "result_digest",
                  "payload", "accepted_at"]


class EventSerializer(serializers.ModelSerializer):
    class Meta:
        model = OperationEvent
        fields = ["seq", "kind", "from_state", "to_state", "server_state", "execution_epoch",
                  "cancel_generation", "data", "created_at"]


class OutboxSerializer(serializers.ModelSerializer):
    class Meta:
        model = OutboxEvent
        fields = ["id", "receipt", "topic", "created_at", "published_at", "attempts"]


class OperationSerializer(serializers.ModelSerializer):
    server = serializers.SlugRelatedField(slug_field="name", read_only=True)
    # Blank until a terminal status is observed; declared so the schema admits "".
    terminal_status = serializers.ChoiceField(choices=TerminalStatus.choices, allow_blank=True,
                                              read_only=True)

    class Meta:
        model = Operation
        fields = ["id", "call_node_id", "server", "tool_name", "execution_mode", "state",
                  "server_state", "server_status_message", "terminal_status", "remote_id",
                  "input_round", "cancel_generation", "execution_epoch", "request_digest",
                  "result_digest", "created_at", "updated_at"]
        read_only_fields = fields


class OperationDetailSerializer(OperationSerializer):
    events = EventSerializer(many=True, read_only=True)
    receipt = serializers.SerializerMethodField()
    outbox = serializers.SerializerMethodField()

    class Meta(OperationSerializer.Meta):
        fields = [*OperationSerializer.Meta.fields, "body", "result", "events", "receipt", "outbox"]
        read_only_fields = fields

    @extend_schema_field(ReceiptSerializer(allow_null=True))
    def get_receipt(self, op: Operation) -> dict[str, Any] | None:
        receipt = TerminalReceipt.objects.filter(operation_id=op.id).first()
        return None if receipt is None else dict(ReceiptSerializer(receipt).data)

    @extend_schema_field(OutboxSerializer(many=True))
    def get_outbox(self, op: Operation) -> list[dict[str, Any]]:
        rows = OutboxEvent.objects.filter(receipt__operation_id=op.id).order_by("id")
        return [dict(r) for r in OutboxSerializer(rows, many=True).data]


class OperationFilterSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=State.choices, required=False)
    call_node_id = serializers.CharField(max_length=200, required=False)


class CancelSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True)


class InputRequestSerializer(serializers.ModelSerializer):
    class Meta:
        model = InputRequest
        fields = ["id", "operation", "round", "method", "params", "schema_digest", "deadline",
                  "status", "created_at"]
        read_only_fields = fields


class AnswerSerializer(serializers.Serializer):
    schema_digest = serializers.CharField(max_length=80)
    response = JSONObjectField()


class ReconciliationItemSerializer(serializers.ModelSerializer):
    resolution = serializers.ChoiceField(choices=ReconciliationItem.Resolution.choices, allow_blank=True,
                                         read_only=True)

    class Meta:
        model = ReconciliationItem
        fields = ["id", "operation", "reason", "evidence", "deadline", "status", "resolution",
                  "resolution_reason", "resolved_by", "resolved_at", "created_at"]
        read_only_fields = fields


class ResolveSerializer(serializers.Serializer):
    resolution = serializers.ChoiceField(choices=ReconciliationItem.Resolution.choices)
    reason = serializers.CharField(max_length=2000)
    evidence = JSONObjectField(required=False, default=dict)
    # attach_remote_id needs the id found by hand; accept_terminal needs the observed status.
    remote_id = serializers.CharField(max_length=300, required=False, default="")
    terminal_status = serializers.ChoiceField(choices=TerminalStatus.choices,
                                              required=False)


class ServerSerializer(serializers.ModelSerializer):
    # Registration strips credentials from URLs; a row stored before that is shown without them.
    url = serializers.SerializerMethodField()

    @extend_schema_field(serializers.CharField())
    def get_url(self, server: ToolServer) -> str:
        return url_without_credentials(server.url)

    class Meta:
        model = ToolServer
        fields = ["name", "url", "adapter_version", "status", "protocol_version", "tools",
                  "sync_bounds", "max_qps", "negotiated_at"]
        read_only_fields = fields
