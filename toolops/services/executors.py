"""The two executor paths and the execution epoch that says which one owns a row.

* legacy: the synchronous call within the tool's published upper bound (`execution_mode="sync"`),
  made and finished by the caller's own process; after a rollback it also continues the task rows
  it inherited, with the remote operations that already exist (poll, cancel, result, acceptance).
  It never starts a synchronous call for a row that has a remote task: that would be a second
  remote operation.
* tasks: the task adapter path (`execution_mode="task"`), polled by the dispatcher.

A row's `executor_path` and `execution_epoch` change together, under the row lock, only in
`toolops.services.rollout.rollout_move`. Every CAS in the ledger names the epoch it read, so a
worker of the previous epoch writes nothing; this module records that refusal as an event
(`stale_epoch_refused`) and gives each path its own claim query and lease-owner namespace, so
the executor of one path never leases the other path's rows.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from ledger.models import Operation, OperationEvent
from ledger.services.events import operation_record_event
from toolops.services.dispatch import claim_due_locked, next_claimable_at

LEGACY = "legacy"
TASKS = "tasks"
PATHS = (LEGACY, TASKS)

# Longest nap between ticks of a path executor (same reasoning as toolops.runner).
MAX_IDLE_SLEEP_SECONDS = 0.5


def executor_path_for_mode(*, mode: str) -> str:
    return LEGACY if mode == "sync" else TASKS


def executor_lease_owner(*, path: str) -> str:
    """A lease owner in the path's namespace: `tasks:<hex>` or `legacy:<hex>`."""
    if path not in PATHS:
        raise ValueError(f"unknown executor path {path!r}")
    return f"{path}:{uuid.uuid4().hex[:16]}"


def _lease_path(lease_owner: str) -> str | None:
    prefix = lease_owner.split(":", 1)[0]
    return prefix if prefix in PATHS else None


def operation_refuse_stale(
    *, operation_id: uuid.UUID, claimed_epoch: int, lease_owner: str, source: str,
    evidence: dict[str, Any] | None = None,
) -> bool:
    """Record and report a write attempt that carries an older epoch than the row's.

    Returns False (records nothing) when the epoch still matches: the caller's failure had
    another cause (a moved state, a lost lease) that its own code already handles.
    """
    row_epoch = Operation.objects.filter(id=operation_id).values_list(
        "execution_epoch", flat=True).first()
    if row_epoch is None or row_epoch <= claimed_epoch:
        return False
    operation_record_event(
        operation_id=operation_id, kind="stale_epoch_refused",
        data={"claimed_epoch": claimed_epoch, "row_epoch": row_epoch,
              "lease_owner": lease_owner, "source": source, **({"evidence": evidence} if evidence else {})},
    )
    return True


def worker_refused_at_start(*, op: Operation, lease_owner: str) -> bool:
    """A worker arriving with a lease an epoch bump revoked, or from the other path's namespace.

    The rollback clears the lease in the same UPDATE that bumps the epoch and writes the revoked
    lease into its `epoch_bumped` event, which is how a late worker learns it is stale.
    """
    path = _lease_path(lease_owner)
    wrong_path = path is not None and path != op.executor_path
    if op.lease_owner == lease_owner and not wrong_path:
        return False
    bump = (
        OperationEvent.objects.filter(operation_id=op.id, kind="epoch_bumped",
                                      data__revoked_lease=lease_owner)
        .values_list("data", flat=True).order_by("-seq").first()
    )
    if bump is None and not wrong_path:
        return False  # an ordinary lost lease: operation_poll answers "stale_lease"
    # A lease of the other path's namespace never works this row, whatever its epoch.
    claimed = int(bump["from_epoch"]) if bump is not None else None
    operation_record_event(
        operation_id=op.id, kind="stale_epoch_refused",
        data={"claimed_epoch": claimed, "row_epoch": op.execution_epoch,
              "lease_owner": lease_owner, "source": "worker_start",
              "row_path": op.executor_path},
    )
    return True


def executor_claim_due(*, path: str, owner: str, limit: int | None = None) -> list[uuid.UUID]:
    """toolops.services.dispatch.operations_claim_due, restricted to one path's rows."""
    if _lease_path(owner) != path:
        raise ValueError(f"lease owner {owner!r} is not in the {path!r} namespace")
    with transaction.atomic():
        return claim_due_locked(owner=owner, limit=limit, path=path)


@dataclass
class PathRunStats:
    path: str
    polls: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)


def executor_run(*, path: str, until_idle: bool, max_seconds: float | None) -> PathRunStats:
    """The embedded loop of one path's executor (toolops.runner runs both paths at once).

    Each row is polled inside the per-row error boundary (toolops.services.boundary)."""
    from toolops.services.boundary import executor_loop

    owner = executor_lease_owner(path=path)
    loop = executor_loop(
        owner=owner, claim=lambda: executor_claim_due(path=path, owner=owner),
        next_due=lambda: next_claimable_at(path=path),
        until_idle=until_idle, max_seconds=max_seconds,
    )
    return PathRunStats(path=path, polls=loop.polls, outcomes=loop.outcomes)
