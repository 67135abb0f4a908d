"""`operation_submit`: commit the row in SUBMITTING with its key, then send.

The order is the guarantee: the submission key is durable before any byte leaves, so an answer
lost in transit leaves a row that knows which key to look for, and nobody sends again under a
new key.
"""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from adapters import (
    AdapterError,
    LostResponseError,
    SessionLostError,
    TransientError,
)
from adapters.base import FetchedResult, SubmitOutcome
from ledger.digests import request_digest
from ledger.models import Operation, ToolServer
from ledger.services.events import event_append_locked
from ledger.services.transitions import operation_transition
from ledger.states import State
from toolops.errors import ServerNotFound, SubmitRefused
from toolops.services.connections import RateLimited, adapter_for_server, server_token_take
from toolops.services.observe import task_schedule_fields
from toolops.services.results import operation_complete_sync, operation_record_terminal_seen
from toolops.services.servers import server_renegotiate

logger = logging.getLogger("toolops.submit")


def _choose_mode(*, server: ToolServer, tool_name: str) -> tuple[str, dict[str, Any]]:
    """Task mode where both the server and the tool support it; else the published sync bound."""
    tool = server.tools.get(tool_name)
    if tool is None:
        raise SubmitRefused(f"tool {tool_name!r} is not published by server {server.name!r}")
    server_tasks = bool(
        server.capabilities.get("tasks", {}).get("requests", {}).get("tools", {}).get("call")
        is not None
    )
    if server_tasks and tool["task_support"] in ("optional", "required"):
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


def _create_row(
    *, server: ToolServer, tool_name: str, tool: dict[str, Any], call_node_id: str,
    arguments: dict[str, Any], ttl_ms: int | None, mode: str, lease_owner: str,
) -> Operation:
    now = timezone.now()
    descriptor_version = tool["descriptor_digest"]
    lease = timedelta(seconds=float(settings.TOOLOPS_LEASE_SECONDS))
    with transaction.atomic(durable=True):
        op = Operation.objects.create(
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
            submission_key=secrets.token_hex(16),
            state=State.SUBMITTING,
            lease_owner=lease_owner,
            lease_expires_at=now + lease,
            # If this process dies before recording the outcome, the dispatcher finds the row
            # when the lease ends and moves it to SUBMISSION_UNKNOWN (never a resend).
            next_poll_at=now + lease,
            ttl_ms=ttl_ms,
            expires_at=now + timedelta(seconds=float(settings.TOOLOPS_WAIT_BUDGET_SECONDS)),
        )
        event_append_locked(
            operation_id=op.id, kind="created", to_state=State.SUBMITTING,
            execution_epoch=op.execution_epoch, cancel_generation=op.cancel_generation,
            data={"submission_key": op.submission_key, "mode": mode},
        )
    return op


def _send(*, op: Operation, server: ToolServer) -> SubmitOutcome | FetchedResult:
    """Send with the row's key. Only a provably unsent request is retried, under the same key."""
    attempts = 1 + int(settings.TOOLOPS_SUBMIT_UNSENT_RETRIES)
    renegotiated = False
    for attempt in range(attempts):
        try:
            # The QPS token first: a refusal here means nothing was sent (see RateLimited below).
            server_token_take(server=server, purpose="submit")
            adapter = adapter_for_server(server=server)
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
        except SessionLostError:
            # A 404 on the session before anything was created in it: open a new session once.
            if renegotiated:
                raise
            server = server_renegotiate(server_id=server.pk, stale_session_id=server.session_id)
            renegotiated = True
        except TransientError as exc:
            if attempt + 1 >= attempts:
                raise
            time.sleep(min(exc.retry_after or 0.2 * (2**attempt), 5.0))
        except RateLimited as limited:
            # The caller is waiting on this submit, and nothing has left yet: one timed wait for
            # the token the bucket named (not a spin), then the same key again.
            wait = (limited.retry_at - timezone.now()).total_seconds()
            if attempt + 1 >= attempts or wait > float(settings.TOOLOPS_SUBMIT_MAX_TOKEN_WAIT_SECONDS):
                raise TransientError(str(limited), detail={"rate_limited": True}) from limited
            time.sleep(max(wait, 0.0))
    raise AssertionError("unreachable")


def operation_submit(
    *,
    server_name: str,
    tool_name: str,
    call_node_id: str,
    arguments: dict[str, Any] | None = None,
    ttl_ms: int | None = None,
) -> Operation:
    try:
        server = ToolServer.objects.get(name=server_name)
    except ToolServer.DoesNotExist as exc:
        raise ServerNotFound(f"no tool server named {server_name!r}") from exc
    if server.status != ToolServer.Status.ENABLED:
        raise SubmitRefused(f"server {server_name!r} is {server.status}: no new submissions")
    if not call_node_id:
        raise SubmitRefused("a call node id is required")
    args = dict(arguments or {})
    mode, tool = _choose_mode(server=server, tool_name=tool_name)
    if ttl_ms is None and mode == "task":
        ttl_ms = int(settings.TOOLOPS_DEFAULT_TTL_MS)
    owner = f"submit-{uuid.uuid4().hex[:12]}"
    op = _create_row(
        server=server, tool_name=tool_name, tool=tool, call_node_id=call_node_id,
        arguments=args, ttl_ms=ttl_ms, mode=mode, lease_owner=owner,
    )
    try:
        outcome = _send(op=op, server=server)
    except LostResponseError as exc:
        # The request may have reached the server: from here only a lookup by key may resolve it.
        operation_transition(
            operation_id=op.id, from_state=State.SUBMITTING, to_state=State.SUBMISSION_UNKNOWN,
            execution_epoch=op.execution_epoch, lease_owner=owner,
            updates={"lease_owner": "", "lease_expires_at": None, "next_poll_at": None},
            event_kind="submission_unknown", event_data={"error": str(exc), "detail": exc.detail},
        )
        return Operation.objects.get(id=op.id)
    except AdapterError as exc:
        # The server answered with a refusal, or the request provably never left (the adapter's
        # TransientError contract: connect failure, or 429/503 that processed nothing): nothing was
        # created, so the row is proven safe and the caller may submit a new attempt.
        operation_transition(
            operation_id=op.id, from_state=State.SUBMITTING, to_state=State.SUBMISSION_UNKNOWN,
            execution_epoch=op.execution_epoch, lease_owner=owner,
            updates={"lease_owner": "", "lease_expires_at": None, "next_poll_at": None},
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
        operation_complete_sync(operation_id=op.id, lease_owner=owner, result=outcome)
        return Operation.objects.get(id=op.id)
    if outcome.task is None:
        # The server ignored `task` and answered synchronously.
        assert outcome.sync_result is not None
        operation_complete_sync(operation_id=op.id, lease_owner=owner, result=outcome.sync_result)
        return Operation.objects.get(id=op.id)

    task = outcome.task
    now = timezone.now()
    if task.status in ("completed", "failed", "cancelled"):
        operation_record_terminal_seen(
            operation_id=op.id, from_state=State.SUBMITTING, lease_owner=owner, task=task,
            remote_id=task.remote_id,
        )
        return Operation.objects.get(id=op.id)
    operation_transition(
        operation_id=op.id, from_state=State.SUBMITTING,
        to_state=State.INPUT_REQUIRED if task.status == "input_required" else State.WORKING,
        execution_epoch=op.execution_epoch, lease_owner=owner,
        updates={
            "remote_id": task.remote_id,
            **task_schedule_fields(op=op, task=task, now=now),
            "lease_owner": "",
            "lease_expires_at": None,
        },
        event_kind="submitted",
        event_data={"remote_id": task.remote_id, "reply": task.raw},
    )
    return Operation.objects.get(id=op.id)
