"""Tool servers and what negotiation with them established."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


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
    # Owning organisation slug; blank = shared by every tenant.
    tenant = models.CharField(max_length=100, blank=True, default="", db_index=True)
    negotiated_at = models.DateTimeField(null=True, blank=True)
    # Credentials kept apart from `url` (which never carries any): {"headers": {name: value},
    # "query": {name: value}}, added to each request at send time. Not editable, so no admin form
    # or ModelSerializer shows it; nothing reads it but the connection layer.
    credentials = models.JSONField(default=dict, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(max_qps__gt=0), name="toolserver_qps_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.adapter_version})"
