"""The manual reconciliation queue: opening an item, and the four ways an operator resolves one.

Lock order, everywhere: the operation row first, then its reconciliation item. Opening an item
moves the row (a conditional UPDATE, which locks it) and then inserts the item in the same
transaction; resolving locks the row with select_for_update, then the item. One order means two
resolvers, or a resolver and the poller, queue on the row lock instead of deadlocking, and the
second resolver then finds the item resolved and is refused (a resolved item stays resolved).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.digests import canonical_digest
from ledger.errors import AcceptanceRefused
from ledger.models import Operation, OperationEvent, ReconciliationItem
from ledger.services.acceptance import input_rounds_withdraw, operation_accept_terminal
from ledger.services.schedule import schedule_at, schedule_cleared, schedule_now
from ledger.services.transitions import operation_transition, operation_update_guarded
from ledger.states import State, TerminalStatus
from toolops.errors import ToolopsError
from toolops.services.json_input import JsonInputRefused, json_input_check
from toolops.services.output_checks import result_defend
from toolops.services.permissions import Action, Actor, permission_require

# Events copied into an item's evidence: enough to judge the case without opening the ledger.
EVIDENCE_EVENTS = 20
Resolution = ReconciliationItem.Resolution


class ReconciliationRefused(ToolopsError):
    """The resolution does not fit the item or its operation; nothing was changed."""


class AlreadyResolved(ReconciliationRefused):
    pass


class EvidenceRejected(ReconciliationRefused):
    """Attested evidence failed the output defense a fetched result must pass; nothing changed."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("evidence rejected by output defense: " + "; ".join(reasons))
        self.reasons = list(reasons)


def _recent_events(*, operation_id: uuid.UUID) -> list[dict[str, Any]]:
    events = OperationEvent.objects.filter(operation_id=operation_id).order_by("-seq")
    return [
        {"seq": e.seq, "kind": e.kind, "from_state": e.from_state, "to_state": e.to_state,
         "server_state": e.server_state, "data": e.data, "created_at": e.created_at.isoformat()}
        for e in reversed(list(events[:EVIDENCE_EVENTS]))
    ]


def operation_to_reconciliation(*, op: Operation, lease_owner: str | None, reason: str,
                                evidence: dict[str, Any]) -> ReconciliationItem:
    """Move the row to RECONCILIATION_REQUIRED and open its item, in one transaction."""
    now = timezone.now()
    with transaction.atomic():
        operation_transition(
            operation_id=op.id, from_state=op.state, to_state=State.RECONCILIATION_REQUIRED,
            execution_epoch=op.execution_epoch, lease_owner=lease_owner,
            updates=schedule_cleared(),
            event_kind="reconciliation_required", event_data={"reason": reason, **evidence},
        )
        return ReconciliationItem.objects.create(
            operation_id=op.id,
            reason=reason,
            evidence={
                "detail": evidence,
                # The last things the server said, verbatim, and how to find the row again.
                "server_state": op.server_state,
                "server_status_message": op.server_status_message,
                "remote_id": op.remote_id,
                "submission_key": op.submission_key,
                "from_state": op.state,
                "events": _recent_events(operation_id=op.id),
            },
            deadline=now + timedelta(seconds=float(settings.TOOLOPS_RECONCILIATION_DEADLINE_SECONDS)),
        )


def _resolve(
    *, item_id: int, actor: Actor | str, reason: str, resolution: str,
    apply: Callable[[Operation, dict[str, Any]], None],
) -> ReconciliationItem:
    if isinstance(actor, str) and not actor.strip():
        raise ReconciliationRefused("a resolution must name who made it")
    if not reason.strip():
        raise ReconciliationRefused("a resolution must say why")
    found = (ReconciliationItem.objects.filter(id=item_id)
             .values_list("operation_id", "operation__tenant").first())
    if found is None:
        raise ReconciliationRefused(f"no reconciliation item {item_id}")
    operation_id, tenant = found
    # Checked before any lock is taken: a refused principal changes and waits on nothing.
    by = permission_require(actor=actor, action=Action.RESOLVE, tenant=tenant).name
    with transaction.atomic(durable=True):
        op = Operation.objects.select_for_update().get(id=operation_id)  # lock order: row, item
        item = ReconciliationItem.objects.select_for_update().get(id=item_id)
        if item.status != ReconciliationItem.Status.OPEN:
            raise AlreadyResolved(
                f"item {item_id} was already resolved ({item.resolution}) by {item.resolved_by}"
            )
        if op.state != State.RECONCILIATION_REQUIRED:
            raise ReconciliationRefused(f"operation {op.id} is {op.state}, not awaiting reconciliation")
        who = {"item_id": item_id, "resolution": resolution, "by": by, "reason": reason}
        apply(op, who)
        # The status condition is the backstop for the lock: a resolved item never changes again.
        changed = ReconciliationItem.objects.filter(
            id=item_id, status=ReconciliationItem.Status.OPEN
        ).update(status=ReconciliationItem.Status.RESOLVED, resolution=resolution,
                 resolution_reason=reason, resolved_by=by, resolved_at=timezone.now())
        if changed != 1:
            raise AlreadyResolved(f"item {item_id} was already resolved")
    item.refresh_from_db()
    return item


def reconciliation_attach_remote_id(*, item_id: int, remote_id: str, actor: Actor | str,
                                    reason: str) -> ReconciliationItem:
    """A remote id found by hand: the row goes back to WORKING and normal polling resumes."""
    remote_id = remote_id.strip()
    if not remote_id:
        raise ReconciliationRefused("attach needs the remote id that was found")

    def apply(op: Operation, who: dict[str, Any]) -> None:
        taken = Operation.objects.filter(server_id=op.server_id, remote_id=remote_id).exclude(id=op.id)
        if taken.exists():
            raise ReconciliationRefused(f"remote id {remote_id!r} already belongs to another operation")
        now = timezone.now()
        operation_transition(
            operation_id=op.id, from_state=State.RECONCILIATION_REQUIRED, to_state=State.WORKING,
            execution_epoch=op.execution_epoch,
            updates={**schedule_at(at=now), "remote_id": remote_id,
                     # A fresh wait budget: the next observation narrows it to the server's ttl.
                     "expires_at": now + timedelta(seconds=float(settings.TOOLOPS_WAIT_BUDGET_SECONDS))},
            event_kind="reconciliation_resolved",
            event_data={**who, "remote_id": remote_id, "previous_remote_id": op.remote_id},
        )

    try:
        return _resolve(item_id=item_id, actor=actor, reason=reason,
                        resolution=Resolution.ATTACH_REMOTE_ID, apply=apply)
    except IntegrityError as exc:
        # Another row took the id between the check above and this write (constraint
        # op_one_operation_per_remote_task): refused, nothing changed.
        if "op_one_operation_per_remote_task" not in str(exc):
            raise
        raise ReconciliationRefused(
            f"remote id {remote_id!r} already belongs to another operation") from exc


def reconciliation_declare_never_created(*, item_id: int, actor: Actor | str,
                                         reason: str) -> ReconciliationItem:
    """NOT_FOUND_SAFE: frees the call node for a new attempt. Refused once a task id is known."""

    def apply(op: Operation, who: dict[str, Any]) -> None:
        if op.remote_id:
            raise ReconciliationRefused(
                f"operation {op.id} has remote id {op.remote_id!r}: it was created"
            )
        operation_transition(
            operation_id=op.id, from_state=State.RECONCILIATION_REQUIRED, to_state=State.NOT_FOUND_SAFE,
            execution_epoch=op.execution_epoch, updates=schedule_cleared(),
            event_kind="reconciliation_resolved", event_data=who,
        )
        input_rounds_withdraw(operation_id=op.id)

    return _resolve(item_id=item_id, actor=actor, reason=reason,
                    resolution=Resolution.NEVER_CREATED, apply=apply)


def reconciliation_accept_terminal(
    *, item_id: int, terminal_status: str, evidence: dict[str, Any] | None, actor: Actor | str,
    reason: str,
) -> ReconciliationItem:
    """Accept a terminal state the operator observed, with the evidence as the stored result.

    The result is stored and digested before acceptance, exactly as a fetched one would be; the
    row is due at once, so if acceptance below does not happen the dispatcher completes it.
    Evidence passes the same output defense as a fetched result (size, content block types, the
    tool's outputSchema, custom hooks); evidence that fails is refused with the reasons
    (EvidenceRejected) and nothing changes: an operator cannot attest what the executor would
    have rejected.
    """
    if terminal_status not in TerminalStatus.values:
        raise ReconciliationRefused(f"terminal status must be one of {', '.join(TerminalStatus.values)}")
    try:
        json_input_check(evidence, field="evidence")
    except JsonInputRefused as exc:
        raise ReconciliationRefused(str(exc)) from exc

    def apply(op: Operation, who: dict[str, Any]) -> None:
        if not op.result_digest and not evidence:
            raise ReconciliationRefused("no result was fetched: the evidence must carry what was seen")
        keep_fetched = bool(op.result_digest) and not evidence
        if keep_fetched and op.terminal_status and op.terminal_status != terminal_status:
            raise ReconciliationRefused(
                f"the fetched result is for {op.terminal_status!r}, not {terminal_status!r}"
            )
        stored = {"kind": "attested", "payload": evidence,
                  "is_error": terminal_status != TerminalStatus.COMPLETED,
                  "status_message": reason, "attested_by": who["by"]}
        # Before anything moves: what is accepted from here passes the pipeline, evidence as the
        # fetched result it stands in for, a stored result again under the settings now in force.
        if not keep_fetched:
            _defend_evidence(op=op, stored=stored, terminal_status=terminal_status)
        elif isinstance(op.result, dict):
            _defend_evidence(op=op, stored=op.result, terminal_status=terminal_status,
                             as_fetched=False)
        operation_transition(
            operation_id=op.id, from_state=State.RECONCILIATION_REQUIRED,
            to_state=State.TERMINAL_OBSERVED, execution_epoch=op.execution_epoch,
            # Due from the first write on (op_open_row_scheduled), not only after the second.
            updates={"terminal_status": terminal_status, **schedule_now(release=False)},
            event_kind="reconciliation_resolved", event_data={**who, "terminal_status": terminal_status},
        )
        operation_transition(
            operation_id=op.id, from_state=State.TERMINAL_OBSERVED, to_state=State.FETCHING_RESULT,
            execution_epoch=op.execution_epoch, updates=schedule_now(release=False),
            event_kind="fetching_result",
        )
        if keep_fetched:
            return
        digest = canonical_digest(stored)
        operation_update_guarded(
            operation_id=op.id, state=State.FETCHING_RESULT, execution_epoch=op.execution_epoch,
            updates={"result": stored, "result_kind": stored["kind"], "result_digest": digest},
            event_kind="result_attested", event_data={"result_digest": digest, "by": who["by"]},
        )

    item = _resolve(item_id=item_id, actor=actor, reason=reason,
                    resolution=Resolution.ACCEPT_TERMINAL, apply=apply)
    op = Operation.objects.get(id=item.operation_id)
    try:
        operation_accept_terminal(
            operation_id=op.id, call_node_id=op.call_node_id, request_digest=op.request_digest,
            remote_id=op.remote_id, descriptor_version=op.descriptor_version,
            execution_epoch=op.execution_epoch, cancel_generation=op.cancel_generation,
            terminal_status=op.terminal_status, result_digest=op.result_digest,
        )
    except AcceptanceRefused:
        pass  # recorded by the acceptance point; the row stays in FETCHING_RESULT for review
    return item


def _defend_evidence(*, op: Operation, stored: dict[str, Any], terminal_status: str,
                     as_fetched: bool = True) -> None:
    # Attested evidence is judged as the fetched result it stands in for: a completed
    # attestation is held to the tool's outputSchema exactly as a `result` would be.
    judged = {**stored, "kind": "result"} if as_fetched else stored
    verdict = result_defend(op=op, stored=judged, terminal_status=terminal_status)
    if not verdict.ok:
        raise EvidenceRejected(verdict.reasons)


def reconciliation_abandon(*, item_id: int, actor: Actor | str, reason: str) -> ReconciliationItem:
    """Close as abandoned. The call node stays taken: its remote work may still exist."""

    def apply(op: Operation, who: dict[str, Any]) -> None:
        operation_transition(
            operation_id=op.id, from_state=State.RECONCILIATION_REQUIRED, to_state=State.ABANDONED,
            execution_epoch=op.execution_epoch, updates=schedule_cleared(),
            event_kind="reconciliation_resolved", event_data=who,
        )
        input_rounds_withdraw(operation_id=op.id)  # an abandoned row takes no more answers

    return _resolve(item_id=item_id, actor=actor, reason=reason,
                    resolution=Resolution.ABANDONED, apply=apply)


def reconciliation_take(*, item_id: int, user_id: int, actor: Actor | str) -> bool:
    """Make a user the owner of an open item. False when the item is resolved (nothing changed).

    Owning an item is the first step of resolving it: the same permission (or organisation role)
    as resolving, checked here so no entry point can skip it."""
    tenant = (ReconciliationItem.objects.filter(id=item_id)
              .values_list("operation__tenant", flat=True).first())
    if tenant is None:
        raise ReconciliationRefused(f"no reconciliation item {item_id}")
    permission_require(actor=actor, action=Action.RESOLVE, tenant=tenant)
    return ReconciliationItem.objects.filter(
        id=item_id, status=ReconciliationItem.Status.OPEN
    ).update(owner_id=user_id) == 1


def reconciliation_resolve(
    *, item_id: int, action: str, actor: Actor | str, reason: str, remote_id: str = "",
    terminal_status: str = "", evidence: dict[str, Any] | None = None,
) -> ReconciliationItem:
    """One entry point by action name, for the CLI."""
    if action == Resolution.ATTACH_REMOTE_ID:
        return reconciliation_attach_remote_id(item_id=item_id, remote_id=remote_id, actor=actor,
                                               reason=reason)
    if action == Resolution.NEVER_CREATED:
        return reconciliation_declare_never_created(item_id=item_id, actor=actor, reason=reason)
    if action == Resolution.ACCEPT_TERMINAL:
        return reconciliation_accept_terminal(item_id=item_id, terminal_status=terminal_status,
                                              evidence=evidence, actor=actor, reason=reason)
    if action == Resolution.ABANDONED:
        return reconciliation_abandon(item_id=item_id, actor=actor, reason=reason)
    raise ReconciliationRefused(
        f"unknown action {action!r}; one of {', '.join(Resolution.values)}"
    )
