"""The reference server's task store (the SDK's in-memory store, adjusted) and its counters."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp import types
from mcp.shared.experimental.tasks.helpers import is_terminal
from mcp.shared.experimental.tasks.in_memory_task_store import InMemoryTaskStore


class PeerTaskStore(InMemoryTaskStore):
    """The SDK's in-memory store with two adjustments.

    * `pollInterval` is hard-coded to 500 ms in `create_task_state`; we overwrite it when
      `--poll-interval-ms` is given.
    * Stock 1.30 lets `tasks/cancel` mark a task cancelled while its work keeps running.
      When that work ends, `run_task` calls `complete()` -> `update_task` raises
      "Cannot transition from terminal status" -> `fail()` raises the same, and the
      exception escapes into the SDK's task group. We make late writes to a terminal task
      no-ops instead, so a cancelled task stays `cancelled` with no result, and the
      work itself is stopped by `PeerState.cancel_scopes` (see `_run_work`).
    """

    def __init__(self, poll_interval_ms: int | None, on_cancel: Callable[[str], None]) -> None:
        super().__init__()
        self._poll_interval_ms = poll_interval_ms
        self._on_cancel = on_cancel

    async def create_task(self, metadata: types.TaskMetadata, task_id: str | None = None) -> types.Task:
        task = await super().create_task(metadata, task_id)
        if self._poll_interval_ms is not None:
            self._tasks[task.taskId].task.pollInterval = self._poll_interval_ms
            task = task.model_copy(update={"pollInterval": self._poll_interval_ms})
        return task

    async def update_task(
        self, task_id: str, status: types.TaskStatus | None = None, status_message: str | None = None
    ) -> types.Task:
        stored = self._tasks.get(task_id)
        if stored is not None and is_terminal(stored.task.status):
            return types.Task(**stored.task.model_dump())  # terminal is final: ignore late writes
        task = await super().update_task(task_id, status=status, status_message=status_message)
        if status == types.TASK_STATUS_CANCELLED:
            self._on_cancel(task_id)
        return task

    async def store_result(self, task_id: str, result: types.Result) -> None:
        stored = self._tasks.get(task_id)
        if stored is not None and is_terminal(stored.task.status):
            return  # don't attach a late result to a cancelled task
        await super().store_result(task_id, result)


@dataclass
class PeerState:
    """Server-side counters and the cooperating-mode dedup index."""

    cooperating: bool = False
    lookup: bool = False  # cooperating "full": also offer the fencing key lookup
    tasks_created: int = 0
    # Keys a lookup declared unknown: a late tools/call with one of them is refused.
    fenced: set[str] = field(default_factory=set)
    refused_fenced: int = 0
    tool_calls: Counter[str] = field(default_factory=Counter)
    submission_keys: Counter[str] = field(default_factory=Counter)
    # (Mcp-Session-Id, submission key) -> taskId, for dedup within a session.
    dedup: dict[tuple[str, str], str] = field(default_factory=dict)
    # submission key -> [(Mcp-Session-Id, taskId)], newest last, for /_peer/lookup.
    by_key: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    # taskId -> cancel scope of its running work, so tasks/cancel can stop it.
    cancel_scopes: dict[str, anyio.CancelScope] = field(default_factory=dict)
    lock: anyio.Lock | None = None

    def reset(self) -> None:
        self.tasks_created = 0
        self.tool_calls.clear()
        self.submission_keys.clear()
        self.dedup.clear()
        self.by_key.clear()
        self.fenced.clear()
        self.refused_fenced = 0

    def cancel_work(self, task_id: str) -> None:
        scope = self.cancel_scopes.get(task_id)
        if scope is not None:
            scope.cancel()

    def snapshot(self) -> dict[str, Any]:
        return {
            "tasks_created": self.tasks_created,
            "tool_calls": dict(self.tool_calls),
            "submission_keys": dict(self.submission_keys),
            "cooperating": self.cooperating,
            "refused_fenced": self.refused_fenced,
        }
