"""Celery settings chosen so that losing a worker loses no work.

The ledger, not the broker, is the source of truth: poll schedules live in PostgreSQL rows and
the beat dispatcher re-claims any row whose lease expired, so a lost message costs one lease period.
"""

from __future__ import annotations

from config.env import env_bool, env_float, env_int, env_str

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
# No result backend: task return values are never read; the ledger records every outcome.
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
# Ack after the task body ran, and requeue if the worker process dies mid-task.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# One message per worker process at a time: a killed worker strands at most one batch.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Redis redelivers unacked messages after this; the row lease (shorter) is what really bounds a
# stall, so this only needs to exceed the longest task body.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("TOOLOPS_VISIBILITY_TIMEOUT", 300)}
# The dispatcher has a queue of its own: behind a backlog of polls on the default queue its tick
# would wait its turn (and expire unrun), leaving due rows unclaimed. A worker started without
# -Q consumes every queue named here; a fleet can also give `toolops.dispatch` its own worker.
DISPATCH_QUEUE = "toolops.dispatch"
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_QUEUES: dict[str, dict[str, str]] = {"celery": {}, DISPATCH_QUEUE: {}}
CELERY_TASK_ROUTES = {"toolops.dispatch_due": {"queue": DISPATCH_QUEUE}}
# How often beat fires the dispatcher: the grain at which poll schedules stored in the ledger are
# honoured (a row due now waits at most this long for its claim). One claim transaction a tick.
TOOLOPS_DISPATCH_INTERVAL_SECONDS = env_float("TOOLOPS_DISPATCH_INTERVAL_SECONDS", 0.25)
# Celery's own persistent scheduler spins (no sleep) through the last 10 ms before each run;
# at four ticks a second that was most of an idle fleet's CPU (toolops/beat.py).
CELERY_BEAT_SCHEDULER = "toolops.beat:SleepingScheduler"
CELERY_BEAT_SCHEDULE = {
    "toolops-dispatch-due": {
        "task": "toolops.dispatch_due",
        "schedule": TOOLOPS_DISPATCH_INTERVAL_SECONDS,
        # A tick that could not run in time is superseded by the next one.
        "options": {"expires": max(TOOLOPS_DISPATCH_INTERVAL_SECONDS, 1.0)},
    },
}

# The outbox relay on beat is opt-in: a host that consumes the outbox itself (toolops.api.
# consume_outbox) must not have a second relay mark its events published first.
if env_bool("TOOLOPS_OUTBOX_RELAY_ON_BEAT", False):
    CELERY_BEAT_SCHEDULE["toolops-relay-outbox"] = {
        "task": "toolops.relay_outbox",
        "schedule": 1.0,
        "options": {"expires": 1.0},
    }
