"""The `/metrics` endpoint (Prometheus text format), closed by default.

It answers only a request carrying `Authorization: Bearer <TOOLOPS_METRICS_TOKEN>`; with no token
configured the endpoint does not exist (404), so a deployment that forgot the setting exposes
nothing. The token is compared in constant time. Prometheus scrapes it with

    scrape_configs:
      - job_name: toolops
        metrics_path: /metrics
        authorization: {type: Bearer, credentials_file: /etc/prometheus/toolops-token}
        static_configs: [{targets: ["toolops.internal:8000"]}]
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from toolops.metrics import metrics_render


def metrics_token_ok(*, header: str) -> bool:
    """Whether an Authorization header carries the configured token (never with none set)."""
    token = str(settings.TOOLOPS_METRICS_TOKEN or "")
    if not token:
        return False
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not settings.TOOLOPS_METRICS_TOKEN:
        raise Http404("metrics are disabled: set TOOLOPS_METRICS_TOKEN")
    if not metrics_token_ok(header=request.headers.get("Authorization", "")):
        response = HttpResponse("a bearer token is required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    body, content_type = metrics_render()
    return HttpResponse(body, content_type=content_type)
