"""Canary selection, shadow eligibility, and moving rows between executors.

Lock order (every writer here and in submit): the RolloutConfig rows of the server first, then
operation rows. A submit that chose the tasks path re-checks its config row under that lock in
the transaction that inserts the row, so a rollback that committed first is never outrun by a
submit that read the config before it ("stop creating operations on the new path" holds even
for submits in progress), and a rollback that takes the lock first sweeps a row committed before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from ledger.models import Operation, RolloutChange, RolloutConfig, ToolServer
from ledger.services.events import event_append_locked
from ledger.services.schedule import RELEASE, schedule_at
from ledger.states import OPEN
from toolops.errors import ServerNotFound, SubmitRefused, ToolopsError
from toolops.services.dispatch import CLAIMABLE
from toolops.services.executors import LEGACY, PATHS, TASKS

# Basis points in 100%: the canary bucket space. 10,000 buckets give a 0.01-point resolution.
BUCKETS = 10_000


def canary_bucket(*, call_node_id: str) -> int:
    """Stable bucket 0..9999 of a call node: SHA-256, not Python's per-process salted hash()."""
    digest = hashlib.sha256(call_node_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def rollout_scope_row(rows: Iterable[RolloutConfig], tool_name: str) -> RolloutConfig | None:
    """The tool's row if any, else the server's row, else None (historic behaviour)."""
    by_tool = {r.tool_name: r for r in rows}
    return by_tool.get(tool_name) or by_tool.get("")


def rollout_config_for(*, server: ToolServer, tool_name: str) -> RolloutConfig | None:
    """The tool's row if any, else the server's row, else None (historic behaviour)."""
    return rollout_scope_row(
        RolloutConfig.objects.filter(server=server, tool_name__in=[tool_name, ""]), tool_name)


def rollout_config_locked(*, server: ToolServer, tool_name: str) -> RolloutConfig | None:
    """rollout_config_for under a SHARE lock on the rows read, for the submit's insert transaction.

    The submit decides its path from these rows and holds them until its row is committed: a
    rollback (FOR UPDATE on the same rows) either committed before this read, and the route sees
    it, or waits for the submit and then sweeps its row. Submits do not block each other (SHARE
    against SHARE). SQLite (embedded) serialises writers itself.
    """
    if connection.vendor != "postgresql":
        return rollout_config_for(server=server, tool_name=tool_name)
    fields = list(RolloutConfig._meta.concrete_fields)
    with connection.cursor() as cursor:
        cursor.execute(
            # Table and column names from the model, no user input.
            f"SELECT {', '.join(connection.ops.quote_name(f.column) for f in fields)} "
            f"FROM {RolloutConfig._meta.db_table} WHERE server_id = %s AND tool_name IN (%s, '') "
            "ORDER BY tool_name FOR SHARE",
            [server.pk, tool_name],
        )
        rows = cursor.fetchall()
    return rollout_scope_row((RolloutConfig.from_db(connection.alias, [f.attname for f in fields],
                                                    row) for row in rows), tool_name)


def tool_is_read_only(*, server: ToolServer, tool_name: str, config: RolloutConfig | None) -> bool:
    """MCP `annotations.readOnlyHint` as published, or an explicit operator setting."""
    if config is not None and config.declared_read_only:
        return True
    descriptor = (server.tools.get(tool_name) or {}).get("descriptor") or {}
    return bool((descriptor.get("annotations") or {}).get("readOnlyHint") is True)


@dataclass(frozen=True)
class Route:
    path: str
    mode: str
    shadow: bool  # record a shadow operation beside this (legacy) call


def rollout_route(
    *, server: ToolServer, tool_name: str, tool: dict[str, Any], call_node_id: str, mode: str,
    offers_tasks: bool, config: RolloutConfig | None,
) -> Route:
    """Which executor path a new call takes, from the tool's `config` (rollout_config_locked).
    Without a RolloutConfig: the mode's own path."""
    if config is None:
        return Route(path=LEGACY if mode == "sync" else TASKS, mode=mode, shadow=False)
    long_call = offers_tasks and tool["task_support"] in ("optional", "required")
    can_legacy = tool_name in server.sync_bounds and tool["task_support"] != "required"
    if not long_call:
        return Route(path=LEGACY, mode="sync", shadow=False)
    if not config.tasks_enabled:
        if not can_legacy:
            raise SubmitRefused(
                f"the tasks path is rolled back for {server.name}/{tool_name} and the tool has no "
                "published synchronous bound: no new operation on either path"
            )
        return Route(path=LEGACY, mode="sync", shadow=False)
    if not can_legacy:
        return Route(path=TASKS, mode="task", shadow=False)  # the only path the tool has
    if canary_bucket(call_node_id=call_node_id) < config.canary_bp:
        return Route(path=TASKS, mode="task", shadow=False)
    shadow = config.shadow_enabled and tool_is_read_only(
        server=server, tool_name=tool_name, config=config)
    return Route(path=LEGACY, mode="sync", shadow=shadow)


def rollout_assert_path_open_locked(*, server: ToolServer, tool_name: str, path: str) -> None:
    """Inside the submit's insert transaction: lock the config rows, re-check the tasks path."""
    if path != TASKS:
        return
    rows = list(RolloutConfig.objects.select_for_update().filter(
        server=server, tool_name__in=[tool_name, ""]).order_by("tool_name"))
    config = rollout_scope_row(rows, tool_name)
    if config is not None and not config.tasks_enabled:
        raise SubmitRefused(f"the tasks path was rolled back for {server.name}/{tool_name}")


def _snapshot(config: RolloutConfig) -> dict[str, Any]:
    return {"canary_bp": config.canary_bp, "tasks_enabled": config.tasks_enabled,
            "shadow_enabled": config.shadow_enabled, "declared_read_only": config.declared_read_only}


def _server(name: str) -> ToolServer:
    try:
        return ToolServer.objects.get(name=name)
    except ToolServer.DoesNotExist as exc:
        raise ServerNotFound(f"no tool server named {name!r}") from exc


def rollout_configure(
    *, server_name: str, tool_name: str = "", actor: str, reason: str,
    canary_percent: float | None = None, shadow: bool | None = None,
    declared_read_only: bool | None = None,
) -> RolloutChange:
    """Set the canary share / shadow switch. Affects calls submitted after the commit only."""
    if not reason.strip():
        raise ToolopsError("a rollout change needs a reason")
    if canary_percent is not None and not 0 <= canary_percent <= 100:
        raise ToolopsError("--canary-percent must be between 0 and 100")
    server = _server(server_name)
    if tool_name and tool_name not in server.tools:
        raise ToolopsError(f"tool {tool_name!r} is not published by server {server_name!r}")
    with transaction.atomic(durable=True):
        config, _ = RolloutConfig.objects.select_for_update().get_or_create(
            server=server, tool_name=tool_name)
        before = _snapshot(config)
        if canary_percent is not None:
            config.canary_bp = round(canary_percent * 100)
        if shadow is not None:
            config.shadow_enabled = shadow
        if declared_read_only is not None:
            config.declared_read_only = declared_read_only
        config.save()
        return RolloutChange.objects.create(
            action="configure", actor=actor, reason=reason, server=server, tool_name=tool_name,
            before=before, after=_snapshot(config),
        )


def rollout_move(
    *, to_path: str, reason: str, actor: str, server_name: str | None = None,
    tool_name: str = "",
) -> RolloutChange:
    """Rollback (`to_path="legacy"`) or roll forward (`"tasks"`), in one durable transaction.

    1. the config rows of the scope close (or reopen) the tasks path for new calls;
    2. every in-flight task-mode row of the other path is locked and, in one UPDATE each, gets
       epoch + 1, the new path, its lease revoked and (if it was scheduled) an immediate poll, so
       the receiving executor continues it with the remote operation that already exists.
    Rows without a remote task to continue (synchronous calls) stay with their caller; rows with a
    receipt are not in flight (acceptance writes the final state with the receipt), so no row
    ever gets a second receipt slot.
    """
    if to_path not in PATHS:
        raise ToolopsError(f"--to must be one of {', '.join(PATHS)}")
    if not reason.strip():
        raise ToolopsError("a rollback needs a reason")
    from_path = TASKS if to_path == LEGACY else LEGACY
    servers = [_server(server_name)] if server_name else list(ToolServer.objects.order_by("pk"))
    now = timezone.now()
    with transaction.atomic(durable=True):
        before: dict[str, Any] = {}
        after: dict[str, Any] = {}
        for server in servers:  # lock order: config rows first (see module docstring)
            config, _ = RolloutConfig.objects.select_for_update().get_or_create(
                server=server, tool_name=tool_name)
            scope = RolloutConfig.objects.select_for_update().filter(server=server)
            if tool_name:
                scope = scope.filter(tool_name=tool_name)
            for row in scope.order_by("tool_name"):
                key = f"{server.name}/{row.tool_name or '*'}"
                before[key] = _snapshot(row)
                row.tasks_enabled = to_path == TASKS
                row.save(update_fields=["tasks_enabled", "updated_at"])
                after[key] = _snapshot(row)
        rows = Operation.objects.select_for_update(of=("self",)).filter(
            executor_path=from_path, execution_mode="task", state__in=OPEN,
            server__in=servers, receipt__isnull=True,
        )
        if tool_name:
            rows = rows.filter(tool_name=tool_name)
        moved = 0
        for op in rows.order_by("created_at"):
            operation_hand_over_locked(op=op, to_path=to_path, reason=reason, actor=actor, now=now)
            moved += 1
        return RolloutChange.objects.create(
            action="rollback" if to_path == LEGACY else "roll_forward", actor=actor, reason=reason,
            server=servers[0] if server_name else None, tool_name=tool_name,
            from_path=from_path, to_path=to_path, before=before, after=after, rows_moved=moved,
        )


def operation_hand_over_locked(
    *, op: Operation, to_path: str, reason: str, actor: str, now: datetime
) -> None:
    """Give one locked row to the other executor: epoch + 1, new path, lease revoked.

    The caller holds the row lock (select_for_update) in its transaction. One UPDATE changes
    epoch and path together, so no reader ever sees the new path with the old epoch; every CAS a
    worker of the old epoch issues afterwards matches nothing. The revoked lease goes into the
    event so that worker, when it comes back, is refused by name (executors.worker_refused_at_start).
    """
    fields: dict[str, Any] = {"execution_epoch": F("execution_epoch") + 1,
                              "executor_path": to_path, **RELEASE, "updated_at": now}
    if op.state in CLAIMABLE:
        # The receiving executor takes it at once (also a row whose schedule lived only in the
        # revoked lease: op_open_row_scheduled).
        fields.update(schedule_at(at=now, release=False))
    changed = Operation.objects.filter(
        Q(id=op.id), Q(execution_epoch=op.execution_epoch), ~Q(executor_path=to_path),
    ).update(**fields)
    if changed != 1:  # impossible under the row lock; refuse loudly rather than skip
        raise ToolopsError(f"operation {op.id} changed under its lock")
    event_append_locked(
        operation_id=op.id, kind="epoch_bumped", from_state=op.state, to_state=op.state,
        server_state=op.server_state, execution_epoch=op.execution_epoch + 1,
        cancel_generation=op.cancel_generation,
        data={"from_epoch": op.execution_epoch, "to_epoch": op.execution_epoch + 1,
              "from_path": op.executor_path, "to_path": to_path, "revoked_lease": op.lease_owner,
              "reason": reason, "actor": actor},
    )
