"""Test settings: PostgreSQL and Redis by default, as in CI and on every machine of this kind.

Concurrency tests need real row locks, so the suite runs on PostgreSQL; set TOOLOPS_TEST_DATABASE_URL
to point it elsewhere. Tests that need PostgreSQL or Redis fail (never skip) when they are absent.
"""

from __future__ import annotations

import dj_database_url

from config.env import env_str
from config.settings import *  # noqa: F403

DATABASES = {
    "default": dj_database_url.parse(
        env_str("TOOLOPS_TEST_DATABASE_URL", "postgres://root@127.0.0.1:5432/toolops"),
        conn_max_age=0,
    )
}
CELERY_BROKER_URL = env_str("TOOLOPS_TEST_BROKER_URL", "redis://127.0.0.1:6379/15")
# Short leases and polls keep end-to-end tests quick; the logic is the same as production values.
TOOLOPS_LEASE_SECONDS = 5.0
TOOLOPS_POLL_FLOOR_SECONDS = 0.05
TOOLOPS_POLL_DEFAULT_SECONDS = 0.2
TOOLOPS_SUBMIT_UNSENT_RETRIES = 1
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Wait in place for a token due within 150 ms (above one interval of the default 10 QPS cap):
# tests that poll right after a submit then exercise their own guard, not QPS pacing. Tests of
# the pacing itself use caps far below this (e.g. 0.5 QPS), so they are still refused.
TOOLOPS_QPS_INLINE_WAIT_SECONDS = 0.15
# The reference servers of the tests listen on loopback: allowed here explicitly (the default
# allow-list, "public", refuses loopback and private networks).
TOOLOPS_SERVER_HOSTS = "public,127.0.0.0/8,::1,localhost"
