"""Per adapter version: may it take new submissions?"""

from __future__ import annotations

from django.db import models


class AdapterState(models.Model):
    """The rollout status of one adapter version (docs/architecture.md).

    `adapter_version` on an operation picks its code path for its whole life; this row only
    decides whether NEW operations may be created with that version. A version without a row
    is enabled. The row is also the lock that orders "disable" against a concurrent submit
    (toolops/services/adapters_admin.py).
    """

    class Status(models.TextChoices):
        ENABLED = "enabled"
        # No new submissions; polling, cancel, input and reconciliation of existing rows go on.
        DRAINING = "draining"
        # Only once none of its rows is open.
        DISABLED = "disabled"

    adapter_version = models.CharField(max_length=64, unique=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ENABLED)
    reason = models.CharField(max_length=500, blank=True)
    changed_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.adapter_version} [{self.status}]"
