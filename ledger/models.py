"""Ledger models: `toolOperation.v1` and the rows beside it (design.md section 3)."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from ledger.states import State, TerminalStatus


class ToolServer(models.Model):
    """A remote tool server and what negotiation with it established."""

    class Status(models.TextChoices):
        ENABLED = "enabled"
        DRAINING = "draining"  # no new submissions; in-flight rows go on to their receipts
        DISABLED = "disabled"

    name = models.SlugField(max_length=100, unique=True)
    url = models.URLField(max_length=500)
    adapter_version = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ENABLED)
    protocol_version = models.CharField(max_length=32, blank=True)
    capabilities = models.JSONField(default=dict, blank=True)
    server_info = models.JSONField(default=dict, blank=True)
    # The persisted MCP session: SDK servers bind tasks to it, so every worker must reuse it.
    session_id = models.CharField(max_length=200, blank=True)
    # name -> {"task_support": ..., "descriptor_digest": ..., "descriptor": {...}}
    tools = models.JSONField(default=dict, blank=True)
    # name -> seconds: the synchronous upper bound published for tools without task support.
    sync_bounds = models.JSONField(default=dict, blank=True)
    max_qps = models.FloatField(default=10.0)
    negotiated_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(max_qps__gt=0), name="toolserver_qps_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.adapter_version})"


class Operation(models.Model):
    """One operation attempt of a call node: the ledger row every flow guards."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    call_node_id = models.CharField(max_length=200, db_index=True)
    server = models.ForeignKey(ToolServer, on_delete=models.PROTECT, related_name="operations")
    tool_name = models.CharField(max_length=200)
    descriptor_version = models.CharField(max_length=80)
    request_digest = models.CharField(max_length=80)
    body = models.JSONField(default=dict)
    adapter_version = models.CharField(max_length=64)
    # "task" (MCP task / LRO) or "sync" (the tool's published synchronous bound).
    execution_mode = models.CharField(max_length=8, default="task")
    submission_key = models.CharField(max_length=64, unique=True)
    remote_id = models.CharField(max_length=300, blank=True, db_index=True)

    state = models.CharField(max_length=32, choices=State.choices, default=State.SUBMITTING)
    server_state = models.CharField(max_length=64, blank=True)  # verbatim server status
    server_status_message = models.TextField(blank=True)

    # poll cursor
    next_poll_at = models.DateTimeField(null=True, blank=True)
    poll_attempts = models.PositiveIntegerField(default=0)
    observation_seq = models.PositiveBigIntegerField(default=0)
    lease_owner = models.CharField(max_length=100, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    poll_interval_ms = models.PositiveIntegerField(null=True, blank=True)

    input_round = models.PositiveIntegerField(default=0)
    cancel_generation = models.PositiveIntegerField(default=0)
    execution_epoch = models.PositiveIntegerField(default=1)
    ttl_ms = models.PositiveBigIntegerField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    terminal_status = models.CharField(
        max_length=16, choices=TerminalStatus.choices, blank=True
    )
    result_kind = models.CharField(max_length=16, blank=True)  # result | error | empty
    result = models.JSONField(null=True, blank=True)
    result_digest = models.CharField(max_length=80, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            # The dispatcher's claim query: due rows in pollable states.
            models.Index(fields=["next_poll_at"], name="op_next_poll_idx",
                         condition=Q(next_poll_at__isnull=False)),
            models.Index(fields=["state"], name="op_state_idx"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(execution_epoch__gte=1), name="op_epoch_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.call_node_id}:{self.tool_name} [{self.state}]"


class OperationEvent(models.Model):
    """Append-only, per-operation ordered series of every transition and observation."""

    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=40)
    from_state = models.CharField(max_length=32, blank=True)
    to_state = models.CharField(max_length=32, blank=True)
    server_state = models.CharField(max_length=64, blank=True)
    execution_epoch = models.PositiveIntegerField()
    cancel_generation = models.PositiveIntegerField()
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["operation_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["operation", "seq"], name="event_seq_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.operation_id}#{self.seq} {self.kind}"


class TerminalReceipt(models.Model):
    """The one accepted terminal state of a call node (per execution epoch)."""

    operation = models.OneToOneField(Operation, on_delete=models.PROTECT, related_name="receipt")
    call_node_id = models.CharField(max_length=200)
    execution_epoch = models.PositiveIntegerField()
    terminal_status = models.CharField(max_length=16, choices=TerminalStatus.choices)
    request_digest = models.CharField(max_length=80)
    remote_id = models.CharField(max_length=300, blank=True)
    descriptor_version = models.CharField(max_length=80)
    cancel_generation = models.PositiveIntegerField()
    result_digest = models.CharField(max_length=80, blank=True)
    # The success or error payload; never set for `cancelled` (a late result is audit-only).
    payload = models.JSONField(null=True, blank=True)
    audit = models.JSONField(default=dict, blank=True)
    accepted_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["call_node_id", "execution_epoch"], name="receipt_one_per_call_node_epoch"
            ),
        ]

    def __str__(self) -> str:
        return f"receipt {self.call_node_id} {self.terminal_status}"


class OutboxEvent(models.Model):
    """What downstream code reads. Exactly one per receipt, written in the acceptance transaction."""

    receipt = models.OneToOneField(TerminalReceipt, on_delete=models.PROTECT, related_name="outbox")
    topic = models.CharField(max_length=64, default="operation.terminal")
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    published_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)

    class Meta:
        indexes = [
            models.Index(fields=["created_at"], name="outbox_unpublished_idx",
                         condition=Q(published_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"outbox {self.topic} for receipt {self.receipt_id}"
