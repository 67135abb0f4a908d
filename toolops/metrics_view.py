"""The `/metrics` endpoint (Prometheus text format). Unauthenticated by convention; expose it only
on an internal network (it carries counts and ages, never payloads or identifiers)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from toolops.metrics import metrics_render


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    body, content_type = metrics_render()
    return HttpResponse(body, content_type=content_type)
