"""Celery tasks: thin, ids only; each reloads its row and re-checks lease and epoch in the service.

The poll tasks run each row inside the per-row error boundary (toolops.services.boundary): a
crash is recorded on the row and the row rescheduled or queued, never left to the broker's
redelivery.
"""

from __future__ import annotations

import gc
import logging
import uuid
from datetime import UTC, datetime
from typing import Any

from celery import shared_task
from celery.signals import (
    worker_before_create_process,
    worker_init,
    worker_process_shutdown,
    worker_shutdown,
)
from django.conf import settings

from toolops.broker import dispatch_room
from toolops.qps import qps_bucket_report
from toolops.services.boundary import exception_redacted, operation_poll_guarded
from toolops.services.dispatch import (
    DispatchPass,
    ledger_statistics_refresh,
    operations_dispatch_due_batches,
    operations_dispatch_following_due,
)
from toolops.services.inputs import input_rounds_expire_due
from toolops.services.outbox import outbox_relay
from toolops.services.poll_batch import operations_poll_batch, poll_threads_stop
from toolops.worker_pool import thread_pool_class

logger = logging.getLogger("toolops.tasks")


def _enqueue_batch(operation_ids: list[uuid.UUID], lease_owner: str,
                   early: dict[uuid.UUID, datetime]) -> None:
    ids = [str(op_id) for op_id in operation_ids]
    if early:  # rows claimed before their time: the worker holds each until it is due
        poll_batch.delay(ids, lease_owner, {str(k): at.isoformat() for k, at in early.items()})
    else:  # the two-argument message, which a worker of the release before also takes
        poll_batch.delay(ids, lease_owner)


def _dispatch_once() -> DispatchPass:
    # Top the poll queue up to its cap, no more (toolops/broker.py); the cap counts rows.
    batch = int(settings.TOOLOPS_POLL_BATCH_SIZE)
    return operations_dispatch_due_batches(
        enqueue_batch=_enqueue_batch, batch_size=batch,
        room=dispatch_room(app=poll_batch.app, rows_per_message=batch))


@shared_task(name="toolops.dispatch_due", ignore_result=True)
def dispatch_due() -> int:
    try:
        input_rounds_expire_due()  # unanswered input deadlines get their recorded outcome
    except Exception as exc:
        logger.warning("input deadline sweep failed: %s", exception_redacted(exc)["type"])
    try:  # plans cached while a table was nearly empty are re-made once it has grown
        ledger_statistics_refresh()
    except Exception as exc:
        logger.warning("statistics refresh failed: %s", exception_redacted(exc)["type"])
    # Within its tick, the dispatcher also wakes when the next row falls due.
    return operations_dispatch_following_due(
        seconds=float(settings.TOOLOPS_DISPATCH_FOLLOW_DUE_SECONDS), dispatch_once=_dispatch_once)


@shared_task(name="toolops.poll_batch", ignore_result=True, acks_late=True)
def poll_batch(operation_ids: list[str], lease_owner: str,
               not_before: dict[str, str] | None = None) -> dict[str, int]:
    """`not_before`: rows the dispatcher claimed ahead of their time, with that time. A time
    that does not parse counts as due now (the poll's own guards decide anyway)."""
    return operations_poll_batch(operation_ids=[uuid.UUID(i) for i in operation_ids],
                                 lease_owner=lease_owner,
                                 not_before=_times_parsed(not_before or {}))


def _times_parsed(raw: dict[str, str]) -> dict[uuid.UUID, datetime]:
    parsed: dict[uuid.UUID, datetime] = {}
    for key, text in raw.items():
        try:
            at = datetime.fromisoformat(text)
            parsed[uuid.UUID(key)] = at if at.tzinfo else at.replace(tzinfo=UTC)
        except (TypeError, ValueError):
            continue
    return parsed


@shared_task(name="toolops.poll_operation", ignore_result=True, acks_late=True)
def poll_operation(operation_id: str, lease_owner: str) -> str:
    """One row per message: kept for messages sent before batches (and for single-row callers)."""
    return operation_poll_guarded(operation_id=uuid.UUID(operation_id), lease_owner=lease_owner)


@shared_task(name="toolops.relay_outbox", ignore_result=True)
def relay_outbox() -> int:
    """One relay pass with the configured handler (TOOLOPS_OUTBOX_HANDLER)."""
    return outbox_relay().published


@worker_init.connect
def _thread_pool_wakes(sender: Any = None, **_kwargs: object) -> None:
    # Sent before the worker builds its pool: `-P threads` gets the pool whose tasks wake the
    # event loop when they end (toolops/worker_pool.py says why); any other pool is unchanged.
    if sender is not None and getattr(sender, "pool_cls", None) is not None:
        sender.pool_cls = thread_pool_class(sender.pool_cls)


@worker_process_shutdown.connect
@worker_shutdown.connect
def _poll_threads_stop(**_kwargs: object) -> None:
    # Held rows go back to the ledger at once and each poll thread closes its connection. A
    # prefork child ends with `worker_process_shutdown`; the thread pool's polls run in the
    # worker's own process, which ends with `worker_shutdown` (a prefork parent has no poll
    # threads, so there it stops nothing).
    poll_threads_stop()
    try:
        # A pool child ends without atexit: its prefetched QPS grants are reported here.
        qps_bucket_report()
    except Exception as exc:
        logger.warning("QPS grant report at shutdown failed: %s", exception_redacted(exc)["type"])


@worker_before_create_process.connect
def _freeze_parent_heap(**_kwargs: object) -> None:
    # A prefork child shares the parent's pages until it writes them, and a garbage collection
    # in the child writes every object it visits (the collector's bookkeeping lives in each
    # object's header): the first full collection in a child copied most of the parent's heap,
    # about 33 MB per child. Objects frozen here (Django, the models, the adapters, all imported
    # before the pool starts) are left out of every later collection, parent's and children's,
    # so their pages stay shared. Collect first so no garbage cycle is frozen for good; the
    # pool's own collection right after this signal then finds only the young generations.
    gc.collect()
    gc.freeze()
