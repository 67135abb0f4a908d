"""Input rounds through a human gate (docs/protocols.md; across processes: docs/conformance.md).

`input_required` pauses polling. The server's pending request is read through the adapter (for
2025-11-25 it arrives once, on an open `tasks/result` stream) and persisted at once as the
`InputRequest` of the next round, with a digest of its requested schema and a deadline. An answer
must name the operation, the round and that digest; it is recorded, then delivered through the
adapter, and polling resumes. A replayed request (same server request id) opens no new round;
an id reused once its round was delivered does (toolops/services/input_replays.py).
A deadline that passes unanswered gets a recorded outcome: a cancel or reconciliation, by policy.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from adapters import AdapterError
from adapters.base import RemoteTask, ServerRequest
from ledger.digests import canonical_digest
from ledger.errors import IllegalTransition
from ledger.models import InputRequest, Operation
from ledger.selectors.rows import operation_load
from ledger.services.events import event_append_locked, operation_record_event
from ledger.services.schedule import schedule_at, schedule_cleared
from ledger.services.transitions import operation_transition
from ledger.states import State
from toolops.services.answer_checks import InputAnswerRefused, elicitation_result
from toolops.services.cancel import CancelRefused, operation_cancel
from toolops.services.connections import adapter_for_server, server_call
from toolops.services.input_replays import (
    delivered_request_keys,
    request_key,
    requests_distinct,
    requests_unseen,
)
from toolops.services.json_input import JsonInputRefused, json_input_check
from toolops.services.permissions import SYSTEM, Action, Actor, operation_tenant, permission_require
from toolops.services.reconcile import operation_to_reconciliation
from toolops.services.schedule import operation_reschedule_after_error

logger = logging.getLogger("toolops.inputs")

# How long one read of the input channel may wait for the server's request. mcp 1.30 sets
# `input_required` just before it queues the request, so it is normally there at once.
INPUT_READ_WAIT_S = 2.0
# Default time a human has to answer; overridable by TOOLOPS_INPUT_DEADLINE_SECONDS.
DEFAULT_INPUT_DEADLINE_S = 3600.0
# What an unanswered deadline does: "reconcile" (an operator decides) or "cancel" (operator policy).
DEFAULT_INPUT_EXPIRY_POLICY = "reconcile"
# Rows handled per sweep call: the dispatcher tick stays small; the rest waits one tick.
EXPIRY_SWEEP_BATCH = 50


def _deadline_seconds() -> float:
    return float(getattr(settings, "TOOLOPS_INPUT_DEADLINE_SECONDS", DEFAULT_INPUT_DEADLINE_S))


def _expiry_policy() -> str:
    return str(getattr(settings, "TOOLOPS_INPUT_EXPIRY_POLICY", DEFAULT_INPUT_EXPIRY_POLICY))


def input_schema_digest(*, method: str, params: dict[str, Any]) -> str:
    """Digest of what the server asks for: the requested schema (elicitation) or, failing one,
    the request parameters without transport metadata (sampling)."""
    schema = params.get("requestedSchema")
    if schema is None:
        schema = {k: v for k, v in params.items() if k != "_meta"}
    return canonical_digest({"method": method, "schema": schema})


# -- opening rounds -----------------------------------------------------------------------


def _read_server_requests(*, op: Operation, remote_id: str) -> tuple[list[ServerRequest], bool]:
    """One bounded read of the task's input channel: (its requests, whether a result came too).

    Raises AdapterError. Whatever the read returns is persisted by the caller at once: the
    server hands each request out once (mcp-tasks.md section 2.5), so an unpersisted one is lost.
    """
    window = server_call(
        server=op.server, purpose="input",
        fn=lambda adapter: adapter.read_input(remote_id=remote_id, wait_s=INPUT_READ_WAIT_S),
        follow_up=True,
    )
    requests = [r for r in window.requests if r.related_task_id in (None, remote_id)]
    return requests, window.result is not None


def operation_open_input_round(
    *, op: Operation, lease_owner: str, task: RemoteTask, fields: dict[str, Any],
    data: dict[str, Any],
) -> str:
    """`input_required` seen while WORKING: read the server's request and open its round."""
    # Taken before the read opens its stream: which ids the server already has our answer for.
    delivered_before, read_started = delivered_request_keys(operation_id=op.id), time.monotonic()
    try:
        requests, result_seen = _read_server_requests(op=op, remote_id=op.remote_id)
    except AdapterError as exc:
        if not operation_reschedule_after_error(op=op, lease_owner=lease_owner, error=exc,
                                                kind="input_read_error"):
            return "stale"
        return "input_read_error"
    with transaction.atomic():
        # Lock order: the operation row, then its input rows.
        locked = Operation.objects.select_for_update().get(id=op.id)
        if locked.lease_owner != lease_owner or locked.execution_epoch != op.execution_epoch:
            # A stale worker (lease lost, or the row handed to the other executor during the
            # read): it writes nothing, not even a note, since an event stamped with the row's
            # current epoch would be a lie. operation_poll records an epoch refusal.
            return "stale"
        fresh, reused = requests_unseen(operation_id=op.id, requests=requests,
                                        delivered_before=delivered_before,
                                        read_started=read_started)
        if locked.state != State.WORKING:
            fresh = []  # moved on (a cancel) under our lease: release it, the status decides
        if not fresh:
            # Nothing new: a replayed `input_required` for an answered round, or the request is not
            # there yet, or the task ended during the read. Keep polling; the status decides.
            Operation.objects.filter(id=op.id, lease_owner=lease_owner,
                                     execution_epoch=op.execution_epoch).update(
                **schedule_at(at=timezone.now() + timedelta(
                    seconds=float(settings.TOOLOPS_POLL_FLOOR_SECONDS))),
                server_state=task.status,
            )
            event_append_locked(
                operation_id=op.id, kind="input_required_no_new_round",
                execution_epoch=locked.execution_epoch, cancel_generation=locked.cancel_generation,
                from_state=locked.state, to_state=locked.state, server_state=task.status,
                data={**data, "requests_seen": [request_key(r.request_id) for r in requests],
                      "result_seen": result_seen},
            )
            return "input_required_replayed"
        rounds = _create_rounds(op=locked, requests=fresh, now=timezone.now())
        operation_transition(
            operation_id=op.id, from_state=State.WORKING, to_state=State.INPUT_REQUIRED,
            execution_epoch=locked.execution_epoch, lease_owner=lease_owner,
            updates={**fields, **schedule_cleared(), "input_round": rounds[-1].round},
            event_kind="input_round_opened",
            event_data={**data, "rounds": [r.round for r in rounds],
                        "server_request_ids": [r.server_request_id for r in rounds],
                        **({"reused_request_ids": reused} if reused else {})},
        )
    return "input_required"


def operation_open_round_on_create(
    *, op: Operation, lease_owner: str, task: RemoteTask, fields: dict[str, Any],
) -> bool:
    """A create reply that is already `input_required`: open round 1 from SUBMITTING.

    The request is read first (still under the submitter's lease, nothing recorded yet), then ONE
    transaction records the remote id, moves SUBMITTING -> INPUT_REQUIRED and opens the round, so
    no reader ever sees the row waiting for input without its round. False when no request could
    be read: the caller records the reply as WORKING and the next poll opens the round.
    """
    try:
        requests, _ = _read_server_requests(op=op, remote_id=task.remote_id)
    except AdapterError as exc:
        logger.info("create reply of %s is input_required; request not read yet: %s", op.id, exc)
        return False
    requests = requests_distinct(requests)  # no round exists yet: only repeats within the read
    if not requests:
        return False
    with transaction.atomic():
        locked = Operation.objects.select_for_update().get(id=op.id)
        if (locked.state != State.SUBMITTING or locked.lease_owner != lease_owner
                or locked.execution_epoch != op.execution_epoch):
            return False  # the caller's own transition then meets the same guard and says why
        rounds = _create_rounds(op=locked, requests=requests, now=timezone.now())
        operation_transition(
            operation_id=op.id, from_state=State.SUBMITTING, to_state=State.INPUT_REQUIRED,
            execution_epoch=locked.execution_epoch, lease_owner=lease_owner,
            updates={**fields, "remote_id": task.remote_id, **schedule_cleared(),
                     "input_round": rounds[-1].round},
            event_kind="submitted",
            event_data={"remote_id": task.remote_id, "reply": task.raw},
        )
        event_append_locked(
            operation_id=op.id, kind="input_round_opened", execution_epoch=locked.execution_epoch,
            cancel_generation=locked.cancel_generation, from_state=State.INPUT_REQUIRED,
            to_state=State.INPUT_REQUIRED, server_state=task.status,
            data={"rounds": [r.round for r in rounds], "position": "create_reply",
                  "server_request_ids": [r.server_request_id for r in rounds]},
        )
    return True


def _create_rounds(*, op: Operation, requests: list[ServerRequest], now: datetime
                   ) -> list[InputRequest]:
    deadline = now + timedelta(seconds=_deadline_seconds())
    created = []
    for offset, request in enumerate(requests, start=1):
        created.append(InputRequest.objects.create(
            operation=op, round=op.input_round + offset,
            server_request_id=request_key(request.request_id), method=request.method,
            params=request.params,
            schema_digest=input_schema_digest(method=request.method, params=request.params),
            deadline=deadline,
        ))
    return created


# -- answering ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Checked:
    input_request_id: int
    server_request_id: str | int
    remote_id: str
    result: dict[str, Any]
    redeliver: bool


def _check_answer(*, op: Operation, ir: InputRequest | None, input_round: int,
                  schema_digest: str, response: Any, now: datetime) -> dict[str, Any]:
    if ir is None:
        raise InputAnswerRefused(
            f"operation {op.id} has no input round {input_round} (latest round is {op.input_round})"
        )
    if ir.status == InputRequest.Status.ANSWERED:
        raise InputAnswerRefused(f"input round {input_round} was already answered")
    if ir.status != InputRequest.Status.OPEN:
        raise InputAnswerRefused(f"input round {input_round} is {ir.status}; it takes no answer")
    if ir.deadline <= now:
        raise InputAnswerRefused(
            f"the deadline of input round {input_round} passed at {ir.deadline.isoformat()}"
        )
    if schema_digest != ir.schema_digest:
        raise InputAnswerRefused(
            f"stale schema digest for round {input_round}: the open request has {ir.schema_digest}"
        )
    if op.state != State.INPUT_REQUIRED:
        raise InputAnswerRefused(f"operation {op.id} is {op.state}, not waiting for input")
    return elicitation_result(ir=ir, response=response)


def _record_answer(*, operation_id: uuid.UUID, input_round: int, schema_digest: str,
                   response: Any, answered_by_id: int | None) -> _Checked:
    now = timezone.now()
    with transaction.atomic(durable=True):
        # Lock order: the operation row, then the input row.
        op = Operation.objects.select_for_update().filter(id=operation_id).first()
        if op is None:
            raise InputAnswerRefused(f"no operation {operation_id}")
        ir = (InputRequest.objects.select_for_update()
              .filter(operation_id=operation_id, round=input_round).first())
        if (ir is not None and ir.status == InputRequest.Status.ANSWERED
                and ir.delivered_at is None and ir.answer == response
                and op.state == State.INPUT_REQUIRED):
            # Recorded but never delivered (the delivering process died): deliver the same answer.
            return _Checked(ir.pk, json.loads(ir.server_request_id), op.remote_id,
                            elicitation_result(ir=ir, response=response), redeliver=True)
        result = _check_answer(op=op, ir=ir, input_round=input_round,
                               schema_digest=schema_digest, response=response, now=now)
        assert ir is not None
        InputRequest.objects.filter(pk=ir.pk).update(
            status=InputRequest.Status.ANSWERED, answer=response, answered_by_id=answered_by_id,
            answered_at=now,
        )
        event_append_locked(
            operation_id=op.id, kind="input_answered", execution_epoch=op.execution_epoch,
            cancel_generation=op.cancel_generation, from_state=op.state, to_state=op.state,
            server_state=op.server_state,
            data={"round": input_round, "schema_digest": schema_digest,
                  "answered_by": answered_by_id, "action": result.get("action")},
        )
        return _Checked(ir.pk, json.loads(ir.server_request_id), op.remote_id, result,
                        redeliver=False)


def _refuse_without_input_channel(*, operation_id: uuid.UUID) -> None:
    """A shape with no input channel (AIP-151) never opens a round: say so, not "no round 1"."""
    op = operation_load(operation_id=operation_id)
    if op is not None and "no_input" in adapter_for_server(server=op.server).capabilities:
        raise InputAnswerRefused(
            f"operation {operation_id} runs on {op.server.adapter_version}, whose operations take "
            f"no input; there is no input round to answer"
        )


def operation_answer_input(*, operation_id: uuid.UUID, input_round: int, schema_digest: str,
                           response: Any, answered_by_id: int | None = None,
                           actor: Actor | str = SYSTEM) -> str:
    """Record and deliver the answer to one input round; polling resumes when none stays open.

    Raises InputAnswerRefused (with the refusal recorded as an event) for a wrong round, a stale
    digest, a passed deadline, an answered round or an answer that does not fit the schema;
    PermissionRefused when `actor` may not answer (toolops/services/permissions.py).
    """
    who = permission_require(actor=actor, action=Action.ANSWER, tenant=operation_tenant(operation_id))
    answered_by_id = answered_by_id if answered_by_id is not None else who.user_id
    try:
        json_input_check(response, field="response")  # jsonb stores no NUL or lone surrogate
    except JsonInputRefused as exc:
        raise InputAnswerRefused(str(exc)) from exc
    try:
        _refuse_without_input_channel(operation_id=operation_id)
        checked = _record_answer(operation_id=operation_id, input_round=input_round,
                                 schema_digest=schema_digest, response=response,
                                 answered_by_id=answered_by_id)
    except InputAnswerRefused as exc:
        if Operation.objects.filter(id=operation_id).exists():
            operation_record_event(operation_id=operation_id, kind="input_answer_refused",
                                   data={"round": input_round, "reason": str(exc)})
        raise
    op = Operation.objects.select_related("server").get(id=operation_id)
    try:
        server_call(
            server=op.server, purpose="input",
            fn=lambda adapter: adapter.answer_input(
                request_id=checked.server_request_id, result=checked.result,
                remote_id=checked.remote_id,
            ),
            follow_up=True,  # an operator is waiting on the delivery
        )
    except AdapterError as exc:
        operation_record_event(operation_id=operation_id, kind="input_delivery_failed",
                               data={"round": input_round, "error": str(exc),
                                     "type": type(exc).__name__, "detail": exc.detail})
        raise InputAnswerRefused(
            f"round {input_round} answer recorded but not delivered ({exc}); answer again with "
            f"the same JSON to retry the delivery"
        ) from exc
    return _resume_after_delivery(op=op, input_request_id=checked.input_request_id,
                                  input_round=input_round)


def _resume_after_delivery(*, op: Operation, input_request_id: int, input_round: int) -> str:
    now = timezone.now()
    with transaction.atomic():
        locked = Operation.objects.select_for_update().get(id=op.id)
        InputRequest.objects.filter(pk=input_request_id).update(delivered_at=now)
        still_open = InputRequest.objects.filter(
            operation_id=op.id, status=InputRequest.Status.OPEN).exists()
        if still_open or locked.state != State.INPUT_REQUIRED:
            event_append_locked(
                operation_id=op.id, kind="input_delivered", execution_epoch=locked.execution_epoch,
                cancel_generation=locked.cancel_generation, from_state=locked.state,
                to_state=locked.state, server_state=locked.server_state,
                data={"round": input_round, "rounds_still_open": still_open},
            )
            return "delivered"
        operation_transition(
            operation_id=op.id, from_state=State.INPUT_REQUIRED, to_state=State.WORKING,
            execution_epoch=locked.execution_epoch, cancel_generation=locked.cancel_generation,
            updates=schedule_at(at=now, release=False), event_kind="input_delivered",
            event_data={"round": input_round, "rounds_still_open": False},
        )
    return "delivered"


# -- deadlines ------------------------------------------------------------------------------


def input_rounds_expire_due(*, now: datetime | None = None,
                            server_ids: Collection[int] | None = None) -> int:
    """Give every open round past its deadline (of these servers' rows) a recorded outcome.
    Called by the dispatcher tick."""
    now = now or timezone.now()
    rounds = InputRequest.objects.filter(status=InputRequest.Status.OPEN, deadline__lte=now)
    if server_ids is not None:
        rounds = rounds.filter(operation__server_id__in=list(server_ids))
    due = list(rounds.order_by("deadline").values_list("id", "operation_id")[:EXPIRY_SWEEP_BATCH])
    for ir_id, operation_id in due:
        _expire_one(input_request_id=ir_id, operation_id=operation_id, now=now)
    return len(due)


def _expire_one(*, input_request_id: int, operation_id: uuid.UUID, now: datetime) -> None:

    policy = _expiry_policy()
    with transaction.atomic(durable=True):
        op = Operation.objects.select_for_update().get(id=operation_id)
        expired = InputRequest.objects.filter(
            pk=input_request_id, status=InputRequest.Status.OPEN, deadline__lte=now
        ).update(status=InputRequest.Status.EXPIRED)
        if not expired:
            return  # answered or swept by someone else meanwhile
        event_append_locked(
            operation_id=op.id, kind="input_deadline_passed", execution_epoch=op.execution_epoch,
            cancel_generation=op.cancel_generation, from_state=op.state, to_state=op.state,
            server_state=op.server_state, data={"input_request_id": input_request_id,
                                                "policy": policy},
        )
        if op.state == State.INPUT_REQUIRED and policy != "cancel":
            operation_to_reconciliation(
                op=op, lease_owner=None, reason="input_deadline_passed",
                evidence={"input_request_id": input_request_id, "deadline_policy": policy},
            )
    if policy == "cancel":
        # After commit: the cancel is a request to the server, never sent inside a transaction.
        try:
            operation_cancel(operation_id=operation_id)
        except (CancelRefused, IllegalTransition) as exc:
            logger.info("deadline cancel of %s not sent: %s", operation_id, exc)
