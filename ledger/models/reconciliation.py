"""The manual reconciliation queue and late effects after an accepted cancel."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from ledger.models.operations import Operation


class ReconciliationItem(models.Model):
    """One case the executor could not prove; an operator resolves it in admin or the CLI."""

    class Status(models.TextChoices):
        OPEN = "open"
        RESOLVED = "resolved"

    class Resolution(models.TextChoices):
        ATTACH_REMOTE_ID = "attach_remote_id"
        NEVER_CREATED = "never_created"
        ACCEPT_TERMINAL = "accept_terminal"
        ABANDONED = "abandoned"

    operation = models.ForeignKey(Operation, on_delete=models.CASCADE,
                                  related_name="reconciliation_items")
    reason = models.CharField(max_length=64)
    evidence = models.JSONField(default=dict, blank=True)
    deadline = models.DateTimeField()
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                              on_delete=models.SET_NULL, related_name="+")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    resolution = models.CharField(max_length=32, choices=Resolution.choices, blank=True)
    resolution_reason = models.TextField(blank=True)
    resolved_by = models.CharField(max_length=150, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["operation"], condition=Q(status="open"),
                                    name="recon_one_open_item_per_operation"),
        ]
        indexes = [models.Index(fields=["deadline"], name="recon_open_deadline_idx",
                                condition=Q(status="open"))]
        permissions = [("resolve_reconciliationitem", "Can resolve reconciliation items")]

    def __str__(self) -> str:
        return f"reconcile {self.operation_id}: {self.reason} [{self.status}]"


class EffectReconciliation(models.Model):
    """EFFECT_RECONCILIATION_REQUIRED: a completion seen after an accepted cancel.

    Recorded beside the state, never as a state change: the cancel receipt stands, and this row
    tells an operator that external effects of the late work may need undoing.
    """

    operation = models.ForeignKey(Operation, on_delete=models.CASCADE,
                                  related_name="effect_reconciliations")
    observed_status = models.CharField(max_length=64)
    source = models.CharField(max_length=64)  # poll, notification, stale worker, ...
    evidence = models.JSONField(default=dict, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"late effect on {self.operation_id}: {self.observed_status}"
