"""Input rounds: one row per `input_required` round, answered through the human gate."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from ledger.models.operations import Operation


class InputRequest(models.Model):
    class Status(models.TextChoices):
        OPEN = "open"
        ANSWERED = "answered"  # answer recorded; delivery to the server tracked by `delivered_at`
        EXPIRED = "expired"  # deadline passed with no answer
        WITHDRAWN = "withdrawn"  # the operation ended (cancel, terminal) before an answer

    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="input_requests")
    round = models.PositiveIntegerField()
    # The server's own request, verbatim: for 2025-11-25 the JSON-RPC id and params of the
    # elicitation/sampling request; for the extension its inputRequests key.
    server_request_id = models.CharField(max_length=200)
    method = models.CharField(max_length=64)
    params = models.JSONField(default=dict)
    schema_digest = models.CharField(max_length=80)
    deadline = models.DateTimeField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    answer = models.JSONField(null=True, blank=True)
    answered_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                    on_delete=models.SET_NULL, related_name="+")
    answered_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["operation", "round"], name="input_one_row_per_round"),
            # A replayed server request must never open a second round while its round waits for
            # delivery. Once delivered the id may come again: mcp 1.30 reuses request ids (see
            # toolops/services/input_replays.py), so uniqueness holds among undelivered rounds.
            models.UniqueConstraint(fields=["operation", "server_request_id"],
                                    condition=Q(delivered_at__isnull=True),
                                    name="input_one_open_round_per_server_request"),
        ]
        indexes = [models.Index(fields=["deadline"], name="input_open_deadline_idx",
                                condition=Q(status="open"))]

    def __str__(self) -> str:
        return f"input round {self.round} of {self.operation_id} [{self.status}]"
