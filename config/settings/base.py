"""Django core settings. The database comes from DATABASE_URL (default: a SQLite file)."""

from __future__ import annotations

from pathlib import Path

import dj_database_url

from config.env import BASE_DIR, env_bool, env_int, env_str

SECRET_KEY = env_str("DJANGO_SECRET_KEY", "toolops-insecure-dev-key-change-me")
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_str("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ledger",
    "toolops",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files (admin, Swagger UI, Redoc) from the same process, with or without DEBUG, under
    # runserver or any WSGI server: nothing else has to be set up to get a styled web UI.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_DEFAULT_SQLITE = f"sqlite:///{BASE_DIR / 'var' / 'toolops.sqlite3'}"
DATABASES = {"default": dj_database_url.parse(env_str("DATABASE_URL", _DEFAULT_SQLITE), conn_max_age=0)}
if DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3":
    # Persistent connections: a Celery task (Django's request boundary there) reuses its
    # process's session instead of opening one per task (a connect, its setup statements and a
    # backend process each time). The health check re-validates a reused session at the start of
    # each task, so one dropped by a database restart is replaced rather than failing the task.
    DATABASES["default"]["CONN_MAX_AGE"] = env_int("TOOLOPS_DB_CONN_MAX_AGE", 300)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = env_bool("TOOLOPS_DB_CONN_HEALTH_CHECKS", True)
    # Server-side binding with prepared statements: the hot statements (the claim, the guarded
    # UPDATEs, the event INSERT) are the same text every time, so PostgreSQL parses and plans each
    # once per session instead of per execution (about a third of the server's CPU per call, by
    # benchmarks/call_cpu.py). A transaction-mode pooler (PgBouncer before 1.21) cannot follow
    # prepared statements across sessions: TOOLOPS_DB_PREPARED=0 turns them off.
    if env_bool("TOOLOPS_DB_PREPARED", True):
        DATABASES["default"].setdefault("OPTIONS", {}).update(
            server_side_binding=True,
            # Prepared from the second execution on: a statement seen once (a migration, an
            # admin page) is not kept; psycopg keeps at most 100 per session (its LRU).
            prepare_threshold=env_int("TOOLOPS_DB_PREPARE_THRESHOLD", 2))
else:
    (BASE_DIR / "var").mkdir(exist_ok=True)
    # The embedded runner writes from one process; a busy timeout rides over short lock waits
    # from a concurrent CLI call instead of failing with "database is locked".
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 20
    # SQLite has no row locks; IMMEDIATE makes every atomic() take the write lock up front, which
    # gives the embedded default the same serialisation select_for_update gives on PostgreSQL.
    DATABASES["default"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
# Admin shows times to the second (operators compare events seconds apart), dates in ISO order.
FORMAT_MODULE_PATH = ["toolops.formats"]
STATIC_URL = "static/"
# `manage.py collectstatic` writes here; WhiteNoise serves it compressed with far-future headers.
STATIC_ROOT = Path(env_str("TOOLOPS_STATIC_ROOT", str(BASE_DIR / "var" / "static")))
try:  # WhiteNoise warns on every start when the directory is missing (before a collectstatic)
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)
except OSError:
    pass  # a read-only deployment has run collectstatic into an existing directory
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Without a collectstatic run (a fresh checkout, the demo), WhiteNoise finds files in the apps
# themselves, so /static/ works at once. Set TOOLOPS_STATIC_FINDERS=0 in production after
# collectstatic to serve only the collected set.
WHITENOISE_USE_FINDERS = env_bool("TOOLOPS_STATIC_FINDERS", True)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "toolops": {"handlers": ["console"], "level": env_str("TOOLOPS_LOG_LEVEL", "WARNING")},
        "ledger": {"handlers": ["console"], "level": env_str("TOOLOPS_LOG_LEVEL", "WARNING")},
        # httpx logs every request URL at INFO; URLs may carry credentials, so keep it quiet.
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
    },
}
