"""`operation_submit`: commit the row in SUBMITTING with its key, then send.

The order is the guarantee: the submission key is durable before any byte leaves, so an answer
lost in transit leaves a row that knows which key to look for, and nobody sends again under a
new key.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import secrets
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from adapters import (
    AdapterError,
    LostResponseError,
    ProtocolViolationError,
    SessionLostError,
    TransientError,
)
from adapters.base import FetchedResult, RemoteTask, SubmitOutcome, TaskAdapter
from ledger.digests import request_digest
from ledger.errors import IllegalTransition, InsertConditionFailed
from ledger.models import Operation, ToolServer
from ledger.selectors.rows import operation_submission_key_taken
from ledger.services.events import operation_insert_with_first_event
from ledger.services.schedule import RELEASE, schedule_at, schedule_leased, schedule_now
from ledger.services.transitions import operation_transition
from ledger.states import State, TerminalStatus
from toolops.errors import LedgerUnavailable, ServerNotFound, SubmissionKeyTaken, SubmitRefused
from toolops.services.adapters_admin import adapter_assert_accepting, adapter_status_check
from toolops.services.admission import (
    Admission,
    admission_forget,
    admission_guard,
    admission_remember,
    admission_remembered,
    submit_admission_locked,
)
from toolops.services.connections import RateLimited, server_call
from toolops.services.executors import TASKS, operation_refuse_stale
from toolops.services.inputs import operation_open_round_on_create
from toolops.services.json_input import json_input_check
from toolops.services.negotiation import server_offers_tasks
from toolops.services.permissions import SYSTEM, Action, Actor, permission_require
from toolops.services.remote_ids import submit_reply_record
from toolops.services.results import operation_complete_sync, operation_settle_terminal
from toolops.services.rollout import (
    Route,
    rollout_assert_path_open_locked,
    rollout_config_for,
    rollout_route,
    tool_is_read_only,
)
from toolops.services.schedule import task_schedule_fields
from toolops.services.servers import server_renegotiate

logger = logging.getLogger("toolops.submit")


def _choose_mode(*, server: ToolServer, tool_name: str) -> tuple[str, dict[str, Any]]:
    """Task mode where both the server and the tool support it; else the published sync bound."""
    tool = server.tools.get(tool_name)
    if tool is None:
        raise SubmitRefused(f"tool {tool_name!r} is not published by server {server.name!r}")
    if server_offers_tasks(server=server) and tool["task_support"] in ("optional", "required"):
        return "task", tool
    if tool["task_support"] == "required":
        raise SubmitRefused(
            f"tool {tool_name!r} requires tasks but server {server.name!r} does not offer them"
        )
    if tool_name in server.sync_bounds:
        return "sync", tool
    raise SubmitRefused(
        f"tool {tool_name!r} on {server.name!r} has no task support and no published synchronous "
        "bound; refusing a call that could outlive any timeout"
    )


def _insert_attempt(*, created: Mapping[str, Any], only_if: tuple[str, list[Any]] | None = None,
                    **fields: Any) -> Operation:
    """One live attempt per call node (constraint op_one_live_attempt_per_node):
    a new attempt is possible only once every earlier one is NOT_FOUND_SAFE. The row and its
    `created` event (`created`: its data) are one statement on PostgreSQL.

    The INSERT skips a conflict (ON CONFLICT DO NOTHING) instead of failing on it, so the key
    check costs no statement of its own when the key is new (every submit but a replay): only
    a skipped insert asks which unique constraint it met, the submission key (a replay, or a
    concurrent submit with the same key that committed first: SubmissionKeyTaken) or the call
    node's live attempt (SubmitRefused). Without a savepoint: nothing failed."""
    op = operation_insert_with_first_event(op=Operation(**fields), kind="created", data=created,
                                           only_if=only_if)
    if op is not None:
        return op
    if operation_submission_key_taken(submission_key=fields["submission_key"]):
        raise SubmissionKeyTaken(fields["submission_key"])
    raise SubmitRefused(
        f"call node {fields['call_node_id']!r} already has an attempt that is not proven "
        "never created (NOT_FOUND_SAFE); resolve it before submitting again"
    )


def _create_row(
    *, server: ToolServer, tool_name: str, tool: dict[str, Any], call_node_id: str,
    arguments: dict[str, Any], ttl_ms: int | None, mode: str, lease_owner: str,
    tenant: str, submission_key: str | None, submission_digest: str,
    path: str, shadow_of: Operation | None = None, path_locked: bool = False,
    adapter_status: str | None = None, only_if: tuple[str, list[Any]] | None = None,
) -> Operation:
    """Insert the row in SUBMITTING, in the caller's transaction (the first of submit's two).

    `path_locked`: the caller chose `path` from rollout rows it read under their lock in this
    transaction (submit_admission_locked), so no re-check is needed; `adapter_status`, the
    adapter's status it read there under its lock (None: read it here); `only_if`, the condition
    the insert is made on when those were read earlier (admission_guard)."""
    now = timezone.now()
    descriptor_version = tool["descriptor_digest"]
    lease = timedelta(seconds=float(settings.TOOLOPS_LEASE_SECONDS))
    # The unique submission key is the guard: a replay, or a concurrent submit with the same key
    # that committed first, meets it at the insert (SubmissionKeyTaken).
    return _insert_row(
        now=now, lease=lease, server=server, tool_name=tool_name, call_node_id=call_node_id,
        arguments=arguments, ttl_ms=ttl_ms, mode=mode, lease_owner=lease_owner,
        tenant=tenant, submission_key=submission_key or secrets.token_hex(16),
        submission_digest=submission_digest, descriptor_version=descriptor_version,
        path=path, shadow_of=shadow_of, path_locked=path_locked, adapter_status=adapter_status,
        only_if=only_if,
    )


def _insert_row(
    *, now: datetime, lease: timedelta, server: ToolServer, tool_name: str, call_node_id: str,
    arguments: dict[str, Any], ttl_ms: int | None, mode: str, lease_owner: str, tenant: str,
    submission_key: str, submission_digest: str, descriptor_version: str,
    path: str, shadow_of: Operation | None, path_locked: bool, adapter_status: str | None,
    only_if: tuple[str, list[Any]] | None = None,
) -> Operation:
    # Draining/disabled adapters take no new rows; the lock orders this against a
    # concurrent disable (toolops/services/adapters_admin.py).
    if adapter_status is None:
        adapter_assert_accepting(version=server.adapter_version)
    else:
        adapter_status_check(version=server.adapter_version, status=adapter_status)
    if not path_locked:
        # A rollback that committed after the path was chosen wins (toolops/services/rollout.py).
        rollout_assert_path_open_locked(server=server, tool_name=tool_name, path=path)
    return _insert_attempt(
        only_if=only_if,
        created={"submission_key": submission_key, "mode": mode, "path": path,
                 **({"shadow_of": str(shadow_of.id)} if shadow_of is not None else {})},
        executor_path=path,
        shadow=shadow_of is not None,
        shadow_of=shadow_of,
        call_node_id=call_node_id,
        server=server,
        tool_name=tool_name,
        descriptor_version=descriptor_version,
        request_digest=request_digest(
            tool_name=tool_name, arguments=arguments, descriptor_version=descriptor_version
        ),
        body={"name": tool_name, "arguments": arguments, "ttl_ms": ttl_ms},
        adapter_version=server.adapter_version,
        execution_mode=mode,
        submission_key=submission_key,
        tenant=tenant,
        submission_digest=submission_digest,
        state=State.SUBMITTING,
        # If this process dies before recording the outcome, the dispatcher finds the row
        # when the lease ends and moves it to SUBMISSION_UNKNOWN (never a resend).
        **schedule_leased(owner=lease_owner, until=now + lease),
        ttl_ms=ttl_ms,
        expires_at=now + timedelta(seconds=float(settings.TOOLOPS_WAIT_BUDGET_SECONDS)),
    )


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
        admitted = _admit_remembered(
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
                admitted = _admit_and_insert(
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


_Admitted = tuple[Operation, ToolServer, dict[str, Any], Route]


def _admit_and_insert(
    *, admission: Admission, server_name: str, tool_name: str, call_node_id: str,
    arguments: dict[str, Any] | None, ttl_ms: int | None, tenant: str,
    submission_key: str | None, submission_digest: str, owner: str,
    only_if: tuple[str, list[Any]] | None,
) -> _Admitted:
    """Decide the row from `admission` and insert it (with `only_if`, on that condition)."""
    server = _server_checked(server=admission.server, server_name=server_name, tenant=tenant)
    try:
        if not call_node_id:
            raise SubmitRefused("a call node id is required")
        args = dict(arguments or {})
        mode, tool = _choose_mode(server=server, tool_name=tool_name)
        # The canary and the rollback switch pick the executor path.
        route = rollout_route(server=server, tool_name=tool_name, tool=tool,
                              call_node_id=call_node_id, mode=mode,
                              offers_tasks=server_offers_tasks(server=server),
                              config=admission.config)
        op = _create_row(
            server=server, tool_name=tool_name, tool=tool, call_node_id=call_node_id,
            arguments=args, ttl_ms=_ttl_for(ttl_ms=ttl_ms, mode=route.mode), mode=route.mode,
            lease_owner=owner, path=route.path, tenant=tenant, submission_key=submission_key,
            submission_digest=submission_digest, path_locked=True,
            adapter_status=admission.adapter_status, only_if=only_if,
        )
    except SubmitRefused as exc:
        # A replay is answered with what its first submit recorded, whatever a new one would
        # meet now (a tool gone, a draining adapter, a rolled-back path): the key decides.
        if submission_key is not None and operation_submission_key_taken(
                submission_key=submission_key):
            raise SubmissionKeyTaken(submission_key) from exc
        raise
    return op, server, tool, route


def _admit_remembered(
    *, server_name: str, tool_name: str, call_node_id: str, arguments: dict[str, Any] | None,
    ttl_ms: int | None, tenant: str, submission_key: str | None, submission_digest: str,
    owner: str,
) -> _Admitted | None:
    """The submit's first commit as one statement, when this process remembers an admission
    for the server and tool: the row is decided from it and inserted only if the rows it was
    read from are still those versions (admission_guard, which takes the admission read's SHARE
    locks inside the insert's own statement). None when there is nothing remembered, or when it
    no longer holds or refuses the call: the caller then reads afresh under lock, so a refusal
    is only ever made from a fresh read."""
    admission = admission_remembered(server_name=server_name, tool_name=tool_name)
    if admission is None or admission.fingerprint is None or connection.in_atomic_block:
        return None
    guard = admission_guard(fingerprint=admission.fingerprint, tool_name=tool_name)
    try:
        return _admit_and_insert(
            admission=admission, server_name=server_name, tool_name=tool_name,
            call_node_id=call_node_id, arguments=arguments, ttl_ms=ttl_ms, tenant=tenant,
            submission_key=submission_key, submission_digest=submission_digest, owner=owner,
            only_if=guard)
    except (InsertConditionFailed, SubmitRefused, ServerNotFound):
        admission_forget(server_name=server_name, tool_name=tool_name)
        return None


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


def _server_checked(*, server: ToolServer | None, server_name: str, tenant: str) -> ToolServer:
    if server is None:
        raise ServerNotFound(f"no tool server named {server_name!r}")
    if tenant and server.tenant not in ("", tenant):
        # Same message as a missing server: another tenant's server names are not disclosed.
        raise ServerNotFound(f"no tool server named {server_name!r}")
    if server.status != ToolServer.Status.ENABLED:
        raise SubmitRefused(f"server {server_name!r} is {server.status}: no new submissions")
    return server


def _ttl_for(*, ttl_ms: int | None, mode: str) -> int | None:
    if ttl_ms is None and mode == "task":
        return int(settings.TOOLOPS_DEFAULT_TTL_MS)
    return ttl_ms


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
        op = _create_row(
            server=server, tool_name=tool_name, tool=tool, call_node_id=call_node_id,
            arguments=arguments, ttl_ms=_ttl_for(ttl_ms=ttl_ms, mode=mode), mode=mode,
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
