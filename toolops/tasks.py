"""Celery tasks: thin, ids only; each reloads its row and re-checks lease and epoch in the service.

The poll task runs its row inside the per-row error boundary (toolops.services.boundary): a crash
is recorded on the row and the row rescheduled or queued, never left to the broker's redelivery.
"""

from __future__ import annotations

import logging
import uuid

from celery import shared_task

from toolops.broker import dispatch_room
from toolops.services.boundary import exception_redacted, operation_poll_guarded
from toolops.services.dispatch import operations_dispatch_due
from toolops.services.inputs import input_rounds_expire_due
from toolops.services.outbox import outbox_relay

logger = logging.getLogger("toolops.tasks")


def _enqueue_poll(operation_id: uuid.UUID, lease_owner: str) -> None:
    poll_operation.delay(str(operation_id), lease_owner)


@shared_task(name="toolops.dispatch_due", ignore_result=True)
def dispatch_due() -> int:
    try:
        input_rounds_expire_due()  # unanswered input deadlines get their recorded outcome
    except Exception as exc:
        logger.warning("input deadline sweep failed: %s", exception_redacted(exc)["type"])
    # Top the poll queue up to its cap, no more (toolops/broker.py).
    return operations_dispatch_due(enqueue=_enqueue_poll,
                                   room=dispatch_room(app=poll_operation.app))


@shared_task(name="toolops.poll_operation", ignore_result=True, acks_late=True)
def poll_operation(operation_id: str, lease_owner: str) -> str:
    return operation_poll_guarded(operation_id=uuid.UUID(operation_id), lease_owner=lease_owner)


@shared_task(name="toolops.relay_outbox", ignore_result=True)
def relay_outbox() -> int:
    """One relay pass with the configured handler (TOOLOPS_OUTBOX_HANDLER)."""
    return outbox_relay().published
