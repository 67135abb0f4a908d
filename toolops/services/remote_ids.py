"""Writing a remote id: never lost to a failing write, never given to two operations.

* One remote task, one operation: constraint op_one_operation_per_remote_task. A row that is
  handed a (server, remote id) pair another row already holds goes to the reconciliation queue
  with reason `remote_id_collision`, naming the other operation; the other row is not touched.
* A `tools/call` reply carries the only copy of its remote id. Its write is retried on a lost
  database connection (with the connection reopened between tries); if it still fails, the id
  is written as a `remote_id_seen` event as soon as the database answers again (the row's
  reconciliation evidence then names it), and the caller gets SubmitReplyUnrecorded, a typed
  one-line error, never a raw database exception. The row itself is left SUBMITTING under its
  lease: when the lease runs out the dispatcher moves it to SUBMISSION_UNKNOWN and resolves it
  by its submission key, never by a second send.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, InterfaceError, OperationalError, transaction

from ledger.errors import IllegalTransition
from ledger.models import Operation
from ledger.services.events import operation_record_event
from ledger.services.transitions import operation_transition
from ledger.states import TRANSITIONS, State
from toolops.errors import LedgerUnavailable
from toolops.services.db_retry import db_connection_reopen, db_write_retrying, exception_redacted

logger = logging.getLogger("toolops.remote_ids")

COLLISION_CONSTRAINT = "op_one_operation_per_remote_task"
REMOTE_ID_COLLISION = "remote_id_collision"
# After the reply's own write failed: keep trying to leave the remote id in the ledger this long.
SEEN_EVIDENCE_SECONDS = 10.0


class SubmitReplyUnrecorded(LedgerUnavailable):
    """The server accepted the call but its reply could not be written to the ledger."""


def is_remote_id_collision(exc: BaseException) -> bool:
    return isinstance(exc, IntegrityError) and COLLISION_CONSTRAINT in str(exc)


def operation_remote_id_collision(
    *, operation_id: uuid.UUID, lease_owner: str | None, remote_id: str, source: str,
    reply: Any = None,
) -> Operation:
    """Queue the row that was handed a remote id another operation holds; the holder is untouched."""
    from toolops.services.reconcile import operation_to_reconciliation

    with transaction.atomic():
        op = Operation.objects.select_for_update().get(id=operation_id)
        other = (Operation.objects.filter(server_id=op.server_id, remote_id=remote_id)
                 .exclude(id=op.id).values_list("id", flat=True).first())
        evidence = {"remote_id": remote_id, "other_operation_id": str(other) if other else None,
                    "source": source, **({"reply": reply} if reply is not None else {})}
        if State.RECONCILIATION_REQUIRED not in TRANSITIONS[State(op.state)]:
            # SUBMITTING reaches the queue through SUBMISSION_UNKNOWN (its only legal way there).
            operation_transition(
                operation_id=op.id, from_state=op.state, to_state=State.SUBMISSION_UNKNOWN,
                execution_epoch=op.execution_epoch, lease_owner=lease_owner,
                event_kind="submission_unknown",
                event_data={"reason": REMOTE_ID_COLLISION, **evidence},
            )
            op.refresh_from_db()
        operation_to_reconciliation(op=op, lease_owner=lease_owner, reason=REMOTE_ID_COLLISION,
                                    evidence=evidence)
    logger.warning("operation %s was handed remote id already held by %s", operation_id, other)
    return Operation.objects.get(id=operation_id)


def _record_seen(*, operation_id: uuid.UUID, remote_id: str, error: dict[str, Any]) -> bool:
    deadline = time.monotonic() + SEEN_EVIDENCE_SECONDS
    while True:
        try:
            operation_record_event(operation_id=operation_id, kind="remote_id_seen",
                                   data={"remote_id": remote_id, "source": "submit_reply",
                                         "write_error": error})
            return True
        except (OperationalError, InterfaceError):
            db_connection_reopen()
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)


def submit_reply_record(
    *, operation_id: uuid.UUID, lease_owner: str, remote_id: str, record: Callable[[], Operation],
    reply: Any = None,
) -> Operation:
    """Record a `tools/call` reply that carries `remote_id`, surviving a database blip."""
    tries = [0]

    def attempt() -> Operation:
        tries[0] += 1
        if tries[0] > 1 and Operation.objects.filter(id=operation_id, remote_id=remote_id).exists():
            # An earlier try committed and only its answer was lost.
            return Operation.objects.get(id=operation_id)
        return record()

    try:
        return db_write_retrying(attempt, what=f"recording the reply of {operation_id}")
    except IllegalTransition as exc:
        if tries[0] == 1:
            raise  # no database trouble: the caller's own handling (a moved epoch) applies
        # The database came back after our lease ran out: the dispatcher already moved the row
        # on (SUBMISSION_UNKNOWN, resolved by key). Leave what we saw; never write over it.
        kept = _record_seen(operation_id=operation_id, remote_id=remote_id,
                            error={"type": type(exc).__name__, "message": "lease ran out"})
        raise SubmitReplyUnrecorded(
            f"the server accepted the call as task {remote_id!r}, but the ledger was unavailable "
            f"until the submit's lease ran out; operation {operation_id} is resolved by its "
            f"submission key ({'the remote id is kept in its events' if kept else 'see the logs'})"
        ) from exc
    except IntegrityError as exc:
        if not is_remote_id_collision(exc):
            raise
        return operation_remote_id_collision(operation_id=operation_id, lease_owner=lease_owner,
                                             remote_id=remote_id, source="submit", reply=reply)
    except (OperationalError, InterfaceError) as exc:
        error = exception_redacted(exc)
        kept = _record_seen(operation_id=operation_id, remote_id=remote_id, error=error)
        logger.error("reply of %s (remote id %s) not recorded: %s", operation_id, remote_id,
                     error["type"])
        where = ("the remote id is kept in its events" if kept
                 else "the remote id is only in this message and the logs")
        raise SubmitReplyUnrecorded(
            f"the server accepted the call as task {remote_id!r} but the ledger is unavailable; "
            f"operation {operation_id} will be resolved by its submission key ({where})"
        ) from exc
