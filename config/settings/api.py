"""REST API, OpenAPI and structured logging settings (output defense and outbox: toolops/defaults.py)."""

from __future__ import annotations

from config.env import env_int, env_str

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
    # Fully offline docs: no validator badge from swagger.io, no web fonts (system fonts instead;
    # the Redoc template override drops drf-spectacular's Google Fonts link).
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None, "persistAuthorization": True},
    "REDOC_UI_SETTINGS": {"theme": {"typography": {
        "fontFamily": "system-ui, -apple-system, 'Segoe UI', sans-serif",
        "headings": {"fontFamily": "system-ui, -apple-system, 'Segoe UI', sans-serif"},
        "code": {"fontFamily": "ui-monospace, 'DejaVu Sans Mono', monospace"},
    }}},
    "COMPONENT_SPLIT_REQUEST": True,
    # Default hooks, then the links between operations (toolops/rest/schema_links.py).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "toolops.rest.schema_links.schema_add_links",
                             "toolops.rest.schema_links.schema_add_error_responses"],
}

# --- Structured JSON logs (toolops/logging.py): operation identity on every line, redacted ---
from toolops.logging import logging_config  # noqa: E402

API_LOGGING = logging_config(level=env_str("TOOLOPS_LOG_LEVEL", "WARNING"))
