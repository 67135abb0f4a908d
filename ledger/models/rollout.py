"""Rollout: canary share, shadow switch, rollback audit, shadow comparisons."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from ledger.models.operations import Operation
from ledger.models.servers import ToolServer


class RolloutConfig(models.Model):
    """Rollout settings for one server, or one tool of it (`tool_name` set).

    A tool row overrides its server row. Without any row, submission keeps its historic choice
    (task mode wherever the server and the tool offer it). The row is also the lock that orders a
    rollback against a concurrent submit's path choice (toolops/services/rollout.py).
    """

    server = models.ForeignKey(ToolServer, on_delete=models.CASCADE, related_name="rollouts")
    tool_name = models.CharField(max_length=200, blank=True)  # "" = every tool of the server
    # Share of long calls (tools with both a task option and a synchronous bound) sent to the new
    # path, in basis points (0..10000), so 5% is 500 and the share needs no float compare.
    canary_bp = models.PositiveIntegerField(default=0)
    # False after `rollback --to legacy`: no new operation is created on the tasks path.
    tasks_enabled = models.BooleanField(default=True)
    shadow_enabled = models.BooleanField(default=False)
    # Explicit "this tool has no side effects" for servers that publish no readOnlyHint.
    declared_read_only = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["server", "tool_name"], name="rollout_one_per_scope"),
            models.CheckConstraint(condition=Q(canary_bp__lte=10000), name="rollout_bp_range"),
        ]

    def __str__(self) -> str:
        return f"rollout {self.server_id}/{self.tool_name or '*'} {self.canary_bp}bp"


class RolloutChange(models.Model):
    """Append-only audit of every rollout change: who, why, what moved."""

    action = models.CharField(max_length=32)  # rollback | roll_forward | canary | shadow
    actor = models.CharField(max_length=150)
    reason = models.TextField()
    server = models.ForeignKey(ToolServer, null=True, blank=True, on_delete=models.PROTECT)
    tool_name = models.CharField(max_length=200, blank=True)
    from_path = models.CharField(max_length=8, blank=True)
    to_path = models.CharField(max_length=8, blank=True)
    before = models.JSONField(default=dict, blank=True)
    after = models.JSONField(default=dict, blank=True)
    rows_moved = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.action} by {self.actor} at {self.created_at:%Y-%m-%d %H:%M}"


class ShadowComparison(models.Model):
    """A shadow operation's own terminal record ("receipt of its own kind") and its comparison
    with the legacy call. Written by acceptance for shadow rows instead of a TerminalReceipt; it
    never has an OutboxEvent, so nothing downstream ever advances on it."""

    class Verdict(models.TextChoices):
        PENDING = "pending"  # the legacy call has no receipt yet
        AGREE = "agree"
        DISAGREE = "disagree"

    shadow_operation = models.OneToOneField(Operation, on_delete=models.PROTECT,
                                            related_name="shadow_comparison")
    legacy_operation = models.ForeignKey(Operation, on_delete=models.PROTECT,
                                         related_name="shadow_comparisons")
    call_node_id = models.CharField(max_length=200)
    tool_name = models.CharField(max_length=200)
    shadow_terminal_status = models.CharField(max_length=16)
    shadow_result_digest = models.CharField(max_length=80, blank=True)
    legacy_terminal_status = models.CharField(max_length=16, blank=True)
    legacy_result_digest = models.CharField(max_length=80, blank=True)
    verdict = models.CharField(max_length=12, choices=Verdict.choices, default=Verdict.PENDING)
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    compared_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"shadow {self.call_node_id} {self.verdict}"
