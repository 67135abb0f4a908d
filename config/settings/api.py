"""REST API, OpenAPI, output defense, outbox relay, metrics and structured logging settings."""

from __future__ import annotations

from config.env import env_float, env_int, env_str

# Appended to INSTALLED_APPS by config/settings/__init__.py (names here must not collide with base:
# the star imports there are sorted, so a collision would be order-dependent).
API_INSTALLED_APPS = [
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    # Swagger UI / Redoc assets served locally: the docs page works without a CDN.
    "drf_spectacular_sidecar",
]

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["toolops.rest.permissions.IsTenantMember"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "toolops.rest.pagination.BoundedLimitOffsetPagination",
    # Bounded pages: a list never loads a whole tenant's ledger into one response.
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "toolops.rest.errors.api_exception_handler",
    # JSON only, bounded in size and depth, NUL and lone surrogates refused by field.
    "DEFAULT_PARSER_CLASSES": ["toolops.rest.parsers.BoundedJSONParser"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}

# --- Request limits and ids (toolops/middleware.py) ---
# Largest request body accepted; a larger declared Content-Length is a 413 before anything is read.
TOOLOPS_MAX_REQUEST_BYTES = env_int("TOOLOPS_MAX_REQUEST_BYTES", 2 * 1024 * 1024)
# Django's own cap on bodies it reads (forms, admin) follows the same limit.
DATA_UPLOAD_MAX_MEMORY_SIZE = TOOLOPS_MAX_REQUEST_BYTES
# Placed first by config/settings/__init__.py: the request id covers every other middleware.
API_MIDDLEWARE = ["toolops.middleware.RequestLimitsMiddleware"]

SPECTACULAR_SETTINGS = {
    "TITLE": "toolops API",
    "DESCRIPTION": "Long-running remote tool calls that end in exactly one accepted terminal state.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Default hooks, then the links between operations (toolops/rest/schema_links.py).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "toolops.rest.schema_links.schema_add_links"],
}

# --- Server URL policy (toolops/services/url_policy.py) ---
# Comma-separated allow-list of what tool server URLs may resolve to: "public" (any globally
# routable address), addresses/CIDRs ("10.0.0.0/8", "127.0.0.0/8", "::1") and host names
# ("tools.internal", "*.corp.example"). Link-local, metadata and unspecified addresses are refused
# whatever it says; loopback and private networks only when listed.
TOOLOPS_SERVER_HOSTS = env_str("TOOLOPS_SERVER_HOSTS", "public")

# --- /metrics (toolops/metrics_view.py, toolops/metrics.py) ---
# Bearer token a scraper must send; empty (the default) disables the endpoint (404).
TOOLOPS_METRICS_TOKEN = env_str("TOOLOPS_METRICS_TOKEN", "")
# Which server names may appear as labels: "shared" (servers shared by every tenant; each
# organisation's own are folded into "tenant"), "all", or "none".
TOOLOPS_METRICS_SERVER_LABELS = env_str("TOOLOPS_METRICS_SERVER_LABELS", "shared")

# --- Tool output defense (toolops/services/output_defense.py) ---
# Largest canonical-JSON size of one result we accept as a success; larger goes to the policy below.
# Smaller than TOOLOPS_MAX_RESULT_BYTES (the transport cap) so a big-but-whole body is still recorded.
TOOLOPS_OUTPUT_MAX_BYTES = env_int("TOOLOPS_OUTPUT_MAX_BYTES", 1024 * 1024)
# MCP content block types a result may carry.
TOOLOPS_OUTPUT_ALLOWED_CONTENT_TYPES = env_str(
    "TOOLOPS_OUTPUT_ALLOWED_CONTENT_TYPES", "text,image,audio,resource_link,resource"
).split(",")
# Dotted paths of extra checks: `check(*, operation, result) -> list[str]` (problems; empty = ok).
TOOLOPS_OUTPUT_VALIDATORS: list[str] = [
    p for p in env_str("TOOLOPS_OUTPUT_VALIDATORS", "").split(",") if p
]
# "reconcile": a rejected result goes to the reconciliation queue (an operator decides);
# "fail": it is accepted as a failed terminal state carrying the rejection reasons.
TOOLOPS_OUTPUT_DEFENSE_POLICY = env_str("TOOLOPS_OUTPUT_DEFENSE_POLICY", "reconcile")

# --- Outbox relay (toolops/services/outbox.py) ---
# `handler(*, event: dict, idempotency_key: str) -> None`; default: a Django signal.
TOOLOPS_OUTBOX_HANDLER = env_str("TOOLOPS_OUTBOX_HANDLER", "toolops.services.outbox.outbox_handler_signal")
# Rows one relay pass claims; each is delivered outside any transaction.
TOOLOPS_OUTBOX_BATCH = env_int("TOOLOPS_OUTBOX_BATCH", 100)
# A claimed row is hidden from other relays this long: longer than one handler call.
TOOLOPS_OUTBOX_LEASE_SECONDS = env_float("TOOLOPS_OUTBOX_LEASE_SECONDS", 60.0)
# Backoff after a failed delivery: base * 2**attempts, capped.
TOOLOPS_OUTBOX_BACKOFF_BASE_SECONDS = env_float("TOOLOPS_OUTBOX_BACKOFF_BASE_SECONDS", 1.0)
TOOLOPS_OUTBOX_BACKOFF_MAX_SECONDS = env_float("TOOLOPS_OUTBOX_BACKOFF_MAX_SECONDS", 300.0)

# --- Structured JSON logs (toolops/logging.py): operation identity on every line, redacted ---
from toolops.logging import logging_config  # noqa: E402

API_LOGGING = logging_config(level=env_str("TOOLOPS_LOG_LEVEL", "WARNING"))
# Task name the Celery outbox handler enqueues (toolops.services.outbox.outbox_celery_handler).
TOOLOPS_OUTBOX_CELERY_TASK = env_str("TOOLOPS_OUTBOX_CELERY_TASK", "toolops.outbox_event")
