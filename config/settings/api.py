"""REST API, OpenAPI and structured logging settings (output defense and outbox: toolops/defaults.py)."""

from __future__ import annotations

from config.env import env_str

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

# --- Structured JSON logs (toolops/logging.py): operation identity on every line, redacted ---
from toolops.logging import logging_config  # noqa: E402

API_LOGGING = logging_config(level=env_str("TOOLOPS_LOG_LEVEL", "WARNING"))
