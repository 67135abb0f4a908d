"""Terminal receipts and the outbox: the only things downstream code advances on."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from ledger.models.operations import NOT_NEGATIVE, Operation, not_negative
from ledger.states import TerminalStatus


class TerminalReceipt(models.Model):
    """The one accepted terminal state of a call node (per execution epoch)."""

    operation = models.OneToOneField(Operation, on_delete=models.PROTECT, related_name="receipt")
    # Call node ids are the caller's names, unique only within one tenant.
    tenant = models.CharField(max_length=100, blank=True, default="")
    call_node_id = models.CharField(max_length=200)
    execution_epoch = models.IntegerField(validators=[NOT_NEGATIVE])
    terminal_status = models.CharField(max_length=16, choices=TerminalStatus.choices)
    request_digest = models.CharField(max_length=80)
    remote_id = models.CharField(max_length=300, blank=True)
    descriptor_version = models.CharField(max_length=80)
    cancel_generation = models.IntegerField(validators=[NOT_NEGATIVE])
    result_digest = models.CharField(max_length=80, blank=True)
    # The success or error payload; never set for `cancelled` (a late result is audit-only).
    payload = models.JSONField(null=True, blank=True)
    audit = models.JSONField(default=dict, blank=True)
    accepted_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "call_node_id", "execution_epoch"],
                name="receipt_one_per_call_node_epoch"
            ),
            # A receipt says how a call ended: never a status the server reports while working.
            models.CheckConstraint(condition=Q(terminal_status__in=TerminalStatus.values),
                                   name="receipt_status_terminal"),
            models.CheckConstraint(condition=not_negative("execution_epoch", "cancel_generation"),
                                   name="receipt_counters_not_negative"),
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
    # Relay claim (toolops/services/outbox.py): not claimable before this time. A claim pushes it
    # one lease ahead, so a relay that dies mid-delivery releases the row when the lease ends; a
    # failed delivery pushes it one backoff ahead.
    available_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(max_length=100, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["created_at"], name="outbox_unpublished_idx",
                         condition=Q(published_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"outbox {self.topic} for receipt {self.receipt_id}"
