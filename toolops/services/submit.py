"""`operation_submit`: commit the row in SUBMITTING with its key, then send.

The order is the guarantee: the submission key is durable before any byte leaves, so an answer
lost in transit leaves a row that knows which key to look for, and nobody sends again under a
new key.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction
from django.utils import timezone

from adapters import (
    AdapterError,
    LostResponseError,
    ProtocolViolationError,
    SessionLostError,
    TransientError,
)
from adapters.base import FetchedResult, RemoteTask, SubmitOutcome, TaskAdapter
from ledger.errors import IllegalTransition
from ledger.models import Operation, ToolServer
from ledger.services.schedule import RELEASE, schedule_at, schedule_now
from ledger.services.transitions import operation_transition
from ledger.states import State, TerminalStatus
from toolops.errors import LedgerUnavailable, SubmitRefused
from toolops.services.admission import (
    admission_remember,
    submit_admission_locked,
)
from toolops.services.connections import RateLimited, server_call
from toolops.services.executors import TASKS, operation_refuse_stale
from toolops.services.inputs import operation_open_round_on_create
from toolops.services.json_input import json_input_check
from toolops.services.permissions import SYSTEM, Action, Actor, permission_require
from toolops.services.remote_ids import submit_reply_record
from toolops.services.results import operation_complete_sync, operation_settle_terminal
from toolops.services.rollout import (
    rollout_config_for,
    tool_is_read_only,
)
from toolops.services.schedule import task_schedule_fields
from toolops.services.servers import server_renegotiate
from toolops.services.submit_row import (
    submit_row_admit,
    submit_row_admit_remembered,
    submit_row_create,
    submit_ttl_for,
)

logger = logging.getLogger("toolops.submit")


def _send_once(adapter: TaskAdapter, *, op: Operation, server: ToolServer
               ) -> SubmitOutcome | FetchedResult:
    if op.execution_mode == "sync":
        bound = float(server.sync_bounds[op.tool_name])
        return adapter.call_sync(
            tool=op.tool_name, arguments=op.body["arguments"], timeout_s=bound,
            submission_key=op.submission_key,
        )
    return adapter.submit(
        tool=op.tool_name, arguments=op.body["arguments"], ttl_ms=op.ttl_ms,
        submission_key=op.submission_key,
    )


def _send(*, op: Operation, server: ToolServer) -> SubmitOutcome | FetchedResult:
    """Send with the row's key. Only a provably unsent request is retried, under the same key."""
    attempts = 1 + int(settings.TOOLOPS_SUBMIT_UNSENT_RETRIES)
    renegotiated = False
    for attempt in range(attempts):
        try:
            # The QPS token first: a refusal here means nothing was sent (see RateLimited below).
            return server_call(server=server, purpose="submit",
                               fn=functools.partial(_send_once, op=op, server=server))
        except SessionLostError:
            # A 404 on the session before anything was created in it: open a new session once.
            if renegotiated:
                raise
            server = server_renegotiate(server_id=server.pk, stale_session_id=server.session_id)
            renegotiated = True
        # Before TransientError: RateLimited is one, but it has its own bounded wait.
        except RateLimited as limited:
            # The caller is waiting on this submit, and nothing has left yet: one timed wait for
            # the token the bucket named (not a spin), then the same key again.
            wait = (limited.retry_at - timezone.now()).total_seconds()
            if attempt + 1 >= attempts or wait > float(settings.TOOLOPS_SUBMIT_MAX_TOKEN_WAIT_SECONDS):
                raise TransientError(str(limited), detail={"rate_limited": True}) from limited
            time.sleep(max(wait, 0.0))
        except TransientError as exc:
            if attempt + 1 >= attempts:
                raise
            time.sleep(min(exc.retry_after or 0.2 * (2**attempt), 5.0))
    raise AssertionError("unreachable")


def operation_submit(
    *,
    server_name: str,
    tool_name: str,
    call_node_id: str,
    arguments: dict[str, Any] | None = None,
    ttl_ms: int | None = None,
    tenant: str = "",
    submission_key: str | None = None,
    submission_digest: str = "",
    actor: Actor | str = SYSTEM,
) -> Operation:
    """Submit one call. `submission_key` (else a random one) is the key the server dedups on.

    A tenant sees only its own servers and the shared ones (blank tenant); a given key that is
    already taken raises SubmissionKeyTaken (toolops/services/idempotency.py turns that into a replay).
    PermissionRefused when `actor` may not submit for `tenant` (toolops/services/permissions.py).
    """
    permission_require(actor=actor, action=Action.SUBMIT, tenant=tenant)
    # NUL, lone surrogates, depth: a refusal naming the field, never a database error.
    json_input_check({"server": server_name, "tool": tool_name, "call_node_id": call_node_id,
                      "arguments": arguments}, field="submission")
    owner = f"submit-{uuid.uuid4().hex[:12]}"
    with _ledger_write("recording the submission"):
        admitted = submit_row_admit_remembered(
            server_name=server_name, tool_name=tool_name, call_node_id=call_node_id,
            arguments=arguments, ttl_ms=ttl_ms, tenant=tenant, submission_key=submission_key,
            submission_digest=submission_digest, owner=owner)
        if admitted is None:
            # The first commit: everything the row is decided from is read inside it, and the
            # key check (a replay under an idempotency key) is the insert's own: a key already
            # taken skips the insert (SubmissionKeyTaken), with no read of its own ahead of it.
            with transaction.atomic(durable=True):
                # Read under the lock the insert needs: the path is chosen from rows no
                # rollback can change before this transaction commits.
                admission = submit_admission_locked(server_name=server_name, tool_name=tool_name)
                admitted = submit_row_admit(
                    admission=admission, server_name=server_name, tool_name=tool_name,
                    call_node_id=call_node_id, arguments=arguments, ttl_ms=ttl_ms, tenant=tenant,
                    submission_key=submission_key, submission_digest=submission_digest,
                    owner=owner, only_if=None)
            admission_remember(server_name=server_name, tool_name=tool_name, admission=admission)
    op, server, tool, route = admitted
    # The send, then the second commit: the reply.
    op = _send_and_record(op=op, server=server, owner=owner)
    if route.shadow:
        shadow_submit(legacy=op, server=server, tool=tool, ttl_ms=ttl_ms)
    return op


@contextlib.contextmanager
def _ledger_write(what: str) -> Iterator[None]:
    """A lost database connection before anything is sent: the caller gets one typed line, never
    the driver's error (its message may quote the row), and may retry with the same key."""
    try:
        yield
    except (OperationalError, InterfaceError) as exc:
        raise LedgerUnavailable(
            f"{what} failed: the ledger is unavailable ({type(exc).__name__}); nothing was sent "
            "to the server, retry with the same key") from exc


def shadow_submit(
    *, legacy: Operation, server: ToolServer, tool: dict[str, Any], ttl_ms: int | None
) -> Operation | None:
    """Record a shadow operation beside a legacy call of a side-effect-free tool.

    It runs on the tasks path and reaches its own terminal state, but acceptance gives it a
    ShadowComparison, never a receipt or an outbox row. Its failure never touches the legacy call.
    Only a synchronous (legacy) call has a shadow: the legacy acceptance looks for comparisons
    waiting on its receipt only when the row is synchronous (ledger/services/acceptance.py).
    """
    if legacy.execution_mode != "sync":
        raise SubmitRefused("only a synchronous (legacy) call can have a shadow")
    if not tool_is_read_only(server=server, tool_name=legacy.tool_name,
                             config=rollout_config_for(server=server, tool_name=legacy.tool_name)):
        # Never shadow a tool with side effects: the shadow would do the effect a second time.
        raise SubmitRefused(f"tool {legacy.tool_name!r} is not declared side-effect free")
    try:
        return _submit_row(
            server=server, tool_name=legacy.tool_name, tool=tool, call_node_id=legacy.call_node_id,
            arguments=dict(legacy.body.get("arguments") or {}), ttl_ms=ttl_ms, mode="task",
            path=TASKS, shadow_of=legacy, tenant=legacy.tenant,
        )
    except SubmitRefused as exc:
        logger.warning("shadow of %s not recorded: %s", legacy.id, exc)
        return None


def _submit_row(
    *, server: ToolServer, tool_name: str, tool: dict[str, Any], call_node_id: str,
    arguments: dict[str, Any], ttl_ms: int | None, mode: str, path: str,
    shadow_of: Operation | None = None, tenant: str = "", submission_key: str | None = None,
    submission_digest: str = "",
) -> Operation:
    owner = f"submit-{uuid.uuid4().hex[:12]}"
    with _ledger_write("recording the submission"), transaction.atomic(durable=True):
        op = submit_row_create(
            server=server, tool_name=tool_name, tool=tool, call_node_id=call_node_id,
            arguments=arguments, ttl_ms=submit_ttl_for(ttl_ms=ttl_ms, mode=mode), mode=mode,
            lease_owner=owner, path=path, shadow_of=shadow_of, tenant=tenant,
            submission_key=submission_key, submission_digest=submission_digest,
        )
    return _send_and_record(op=op, server=server, owner=owner)


def _send_and_record(*, op: Operation, server: ToolServer, owner: str) -> Operation:
    try:
        outcome = _send(op=op, server=server)
    except (LostResponseError, ProtocolViolationError) as exc:
        # The request may have reached the server (no answer, or one we cannot read): from here
        # only a lookup by key may resolve it, never a send under a new key. Due at once for the
        # resolution pass (toolops.services.resolution).
        operation_transition(
            operation_id=op.id, from_state=State.SUBMITTING, to_state=State.SUBMISSION_UNKNOWN,
            execution_epoch=op.execution_epoch, lease_owner=owner,
            updates=schedule_now(),
            event_kind="submission_unknown",
            event_data={"error": str(exc), "type": type(exc).__name__, "detail": exc.detail},
        )
        return Operation.objects.get(id=op.id)
    except AdapterError as exc:
        # The server answered with a refusal, or the request provably never left (the adapter's
        # TransientError contract: connect failure, or 429/503 that processed nothing): nothing was
        # created, so the row is proven safe and the caller may submit a new attempt.
        operation_transition(
            operation_id=op.id, from_state=State.SUBMITTING, to_state=State.SUBMISSION_UNKNOWN,
            execution_epoch=op.execution_epoch, lease_owner=owner,
            # Due (op_open_row_scheduled) until the next transition: should it fail, the
            # resolution pass looks the key up and finds nothing.
            updates=schedule_now(),
            event_kind="submit_refused_by_server",
            event_data={"error": str(exc), "type": type(exc).__name__, "detail": exc.detail},
        )
        op = Operation.objects.get(id=op.id)
        operation_transition(
            operation_id=op.id, from_state=State.SUBMISSION_UNKNOWN, to_state=State.NOT_FOUND_SAFE,
            execution_epoch=op.execution_epoch,
            event_kind="never_created", event_data={"evidence": "server refused the call"},
        )
        return Operation.objects.get(id=op.id)

    if isinstance(outcome, FetchedResult):
        operation_complete_sync(operation_id=op.id, lease_owner=owner, result=outcome, op=op)
        return Operation.objects.get(id=op.id)
    if outcome.task is None:
        # The server ignored `task` and answered synchronously.
        assert outcome.sync_result is not None
        operation_complete_sync(operation_id=op.id, lease_owner=owner, result=outcome.sync_result,
                                op=op)
        return Operation.objects.get(id=op.id)

    task = outcome.task
    try:
        # Retried on a database blip; a remote id held by another row queues this one.
        return submit_reply_record(
            operation_id=op.id, lease_owner=owner, remote_id=task.remote_id, reply=task.raw,
            record=functools.partial(_record_task_reply, op=op, owner=owner, task=task))
    except IllegalTransition:
        # A rollback handed the row to the other executor while the request was in transit: this
        # submitter is a worker of the old epoch and writes nothing more. The reply goes into the
        # refusal as evidence; the row (lease revoked, due now) is resolved by its new owner by
        # key, never sent again.
        if not operation_refuse_stale(
            operation_id=op.id, claimed_epoch=op.execution_epoch, lease_owner=owner,
            source="submit", evidence={"remote_id": task.remote_id, "status": task.status},
        ):
            raise
        return Operation.objects.get(id=op.id)


def _record_task_reply(*, op: Operation, owner: str, task: RemoteTask) -> Operation:
    now = timezone.now()
    if task.status in TerminalStatus.values:
        # Done on create (AIP-151 allows it): fetch, then status, result and receipt in one
        # transaction, still under our lease.
        operation_settle_terminal(op=op, lease_owner=owner, task=task, from_state=State.SUBMITTING,
                                  remote_id=task.remote_id)
        return Operation.objects.get(id=op.id)
    fields = task_schedule_fields(op=op, task=task, now=now)
    if task.status == "input_required":
        # Round 1 opens with the reply (SUBMITTING -> INPUT_REQUIRED); if its request cannot be
        # read yet, the row is WORKING and due now, and the poll opens the round.
        if operation_open_round_on_create(op=op, lease_owner=owner, task=task, fields=fields):
            return Operation.objects.get(id=op.id)
        fields.update(schedule_at(at=now, release=False))
    to_state = State.WORKING
    updates = {"remote_id": task.remote_id, **fields, **RELEASE}
    operation_transition(
        operation_id=op.id, from_state=State.SUBMITTING, to_state=to_state,
        execution_epoch=op.execution_epoch, lease_owner=owner, updates=updates,
        event_kind="submitted",
        event_data={"remote_id": task.remote_id, "reply": task.raw},
        known={"cancel_generation": op.cancel_generation},
    )
    # The row as written (the guarded UPDATE matched it): no read back.
    for name, value in updates.items():
        setattr(op, name, value)
    op.state = to_state
    op.updated_at = now
    return op
