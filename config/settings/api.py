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
}

SPECTACULAR_SETTINGS = {
    "TITLE": "toolops API",
    "DESCRIPTION": "Long-running remote tool calls that end in exactly one accepted terminal state.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Fully offline docs: no validator badge from swagger.io, no web fonts (system fonts instead;
    # the Redoc template override drops drf-spectacular's Google Fonts link).
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None, "persistAuthorization": True},
    "REDOC_UI_SETTINGS": {"theme": {"typography": {
        "fontFamily": "system-ui, -apple-system, 'Segoe UI', sans-serif",
        "headings": {"fontFamily": "system-ui, -apple-system, 'Segoe UI', sans-serif"},
        "code": {"fontFamily": "ui-monospace, 'DejaVu Sans Mono', monospace"},
    }}},
    "COMPONENT_SPLIT_REQUEST": True,
}

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
