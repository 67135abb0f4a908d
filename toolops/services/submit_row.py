"""A submit's first commit: the row decided from an admission and inserted in SUBMITTING.

`submit_row_admit` decides the call's mode and executor path from an admission (the server, the
adapter's status and the tool's rollout row: toolops/services/admission.py) and inserts the row
with its `created` event. `submit_row_admit_remembered` does the same from the admission this
process remembers, in one statement made on the condition that the rows it was read from are
unchanged, and gives up (None) whenever that or anything it decided does not hold, so that a
refusal is only ever made from a fresh read. toolops/services/submit.py sends the request and
records the reply.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from ledger.digests import request_digest
from ledger.errors import InsertConditionFailed
from ledger.models import Operation, ToolServer
from ledger.selectors.rows import operation_submission_key_taken
from ledger.services.events import operation_insert_with_first_event
from ledger.services.schedule import schedule_leased
from ledger.states import State
from toolops.errors import ServerNotFound, SubmissionKeyTaken, SubmitRefused
from toolops.services.adapters_admin import adapter_assert_accepting, adapter_status_check
from toolops.services.admission import (
    Admission,
    admission_forget,
    admission_guard,
    admission_remembered,
)
from toolops.services.negotiation import server_offers_tasks
from toolops.services.rollout import Route, rollout_assert_path_open_locked, rollout_route


def submit_mode_choose(*, server: ToolServer, tool_name: str) -> tuple[str, dict[str, Any]]:
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


def submit_row_create(
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


Admitted = tuple[Operation, ToolServer, dict[str, Any], Route]


def submit_row_admit(
    *, admission: Admission, server_name: str, tool_name: str, call_node_id: str,
    arguments: dict[str, Any] | None, ttl_ms: int | None, tenant: str,
    submission_key: str | None, submission_digest: str, owner: str,
    only_if: tuple[str, list[Any]] | None,
) -> Admitted:
    """Decide the row from `admission` and insert it (with `only_if`, on that condition)."""
    server = submit_server_checked(server=admission.server, server_name=server_name, tenant=tenant)
    try:
        if not call_node_id:
            raise SubmitRefused("a call node id is required")
        args = dict(arguments or {})
        mode, tool = submit_mode_choose(server=server, tool_name=tool_name)
        # The canary and the rollback switch pick the executor path.
        route = rollout_route(server=server, tool_name=tool_name, tool=tool,
                              call_node_id=call_node_id, mode=mode,
                              offers_tasks=server_offers_tasks(server=server),
                              config=admission.config)
        op = submit_row_create(
            server=server, tool_name=tool_name, tool=tool, call_node_id=call_node_id,
            arguments=args, ttl_ms=submit_ttl_for(ttl_ms=ttl_ms, mode=route.mode), mode=route.mode,
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


def submit_row_admit_remembered(
    *, server_name: str, tool_name: str, call_node_id: str, arguments: dict[str, Any] | None,
    ttl_ms: int | None, tenant: str, submission_key: str | None, submission_digest: str,
    owner: str,
) -> Admitted | None:
    """The submit's first commit as one statement, when this process remembers an admission
    for the server and tool: the row is decided from it and inserted only if the rows it was
    read from are still those versions (admission_guard, which takes the admission read's SHARE
    locks inside the insert's own statement). None when there is nothing remembered, or when it
    no longer holds or refuses the call: the caller then reads afresh under lock, so a refusal
    is only ever made from a fresh read."""
    admission = admission_remembered(server_name=server_name, tool_name=tool_name)
    if admission is None or connection.in_atomic_block:
        return None
    guard = admission_guard(admission=admission, tool_name=tool_name)
    if guard is None:
        return None
    try:
        return submit_row_admit(
            admission=admission, server_name=server_name, tool_name=tool_name,
            call_node_id=call_node_id, arguments=arguments, ttl_ms=ttl_ms, tenant=tenant,
            submission_key=submission_key, submission_digest=submission_digest, owner=owner,
            only_if=guard)
    except (InsertConditionFailed, SubmitRefused, ServerNotFound):
        admission_forget(server_name=server_name, tool_name=tool_name)
        return None


def submit_server_checked(*, server: ToolServer | None, server_name: str, tenant: str) -> ToolServer:
    if server is None:
        raise ServerNotFound(f"no tool server named {server_name!r}")
    if tenant and server.tenant not in ("", tenant):
        # Same message as a missing server: another tenant's server names are not disclosed.
        raise ServerNotFound(f"no tool server named {server_name!r}")
    if server.status != ToolServer.Status.ENABLED:
        raise SubmitRefused(f"server {server_name!r} is {server.status}: no new submissions")
    return server


def submit_ttl_for(*, ttl_ms: int | None, mode: str) -> int | None:
    if ttl_ms is None and mode == "task":
        return int(settings.TOOLOPS_DEFAULT_TTL_MS)
    return ttl_ms
