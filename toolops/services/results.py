"""Fetch, verify and digest the result, then hand it to the one acceptance point.

`completed` and `failed` are never accepted on the strength of a status alone: the result is
fetched (`tasks/result` or the synchronous answer), checked to belong to this task and to be
whole, stored and digested first. A lost or truncated fetch leaves the row in FETCHING_RESULT.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.utils import timezone

from adapters import AdapterError, NotFoundError
from adapters.base import FetchedResult, RemoteTask
from ledger.digests import canonical_digest
from ledger.errors import AcceptanceRefused, IllegalTransition
from ledger.models import Operation
from ledger.services.acceptance import operation_accept_terminal
from ledger.services.events import operation_record_event
from ledger.services.shadow import operation_accept_shadow_terminal
from ledger.services.transitions import operation_transition, operation_update_guarded
from ledger.states import State
from toolops.logging import operation_logged
from toolops.services.connections import RateLimited, server_call
from toolops.services.observe import (
    RELEASE,
    operation_reschedule_after_error,
    operation_reschedule_rate_limited,
    operation_to_reconciliation,
)
from toolops.services.output_defense import operation_defend_result


class ResultRejected(Exception):
    """The fetched result does not fit the observed terminal status."""


def _stored_result(*, status: str, fetched: FetchedResult | None, status_message: str) -> dict[str, Any]:
    if fetched is None:
        # Only `cancelled` has nothing to fetch; a completed or failed status without its fetched
        # result must never be stored (and so never accepted), whatever the caller's control flow.
        if status != "cancelled":
            raise ResultRejected(f"status {status} but no result was fetched")
        return {"kind": "none", "payload": None, "is_error": False, "status_message": status_message}
    if status == "completed" and fetched.kind != "result":
        raise ResultRejected(f"status completed but the result is {fetched.kind!r}")
    return {
        "kind": fetched.kind,
        "payload": fetched.payload,
        "is_error": fetched.is_error,
        "status_message": status_message,
    }


def operation_record_terminal_seen(
    *, operation_id: uuid.UUID, from_state: State, lease_owner: str, task: RemoteTask,
    remote_id: str | None = None, observation_seq: int | None = None,
) -> None:
    """Record a terminal status from the server. Keeps the lease: fetching follows at once."""
    op = Operation.objects.get(id=operation_id)
    updates: dict[str, Any] = {
        "terminal_status": task.status,
        "server_state": task.status,
        "server_status_message": task.status_message or "",
        "poll_interval_ms": task.poll_interval_ms,
        # Due at once if this worker dies now: the next claimer continues with the fetch.
        "next_poll_at": timezone.now(),
    }
    if remote_id is not None:
        updates["remote_id"] = remote_id
    if observation_seq is not None:
        updates["observation_seq"] = observation_seq
    operation_transition(
        operation_id=operation_id, from_state=from_state, to_state=State.TERMINAL_OBSERVED,
        execution_epoch=op.execution_epoch, lease_owner=lease_owner, updates=updates,
        event_kind="terminal_observed",
        event_data={"status": task.status, "status_message": task.status_message,
                    "observation_seq": observation_seq},
    )


def _accept_from_row(*, operation_id: uuid.UUID) -> str:
    op = Operation.objects.get(id=operation_id)
    if op.shadow:
        return _accept_shadow(op=op)
    try:
        receipt = operation_accept_terminal(
            operation_id=op.id, call_node_id=op.call_node_id, request_digest=op.request_digest,
            remote_id=op.remote_id, descriptor_version=op.descriptor_version,
            execution_epoch=op.execution_epoch, cancel_generation=op.cancel_generation,
            terminal_status=op.terminal_status, result_digest=op.result_digest,
        )
    except AcceptanceRefused:
        return "acceptance_refused"
    return f"accepted:{receipt.terminal_status}"


def _accept_shadow(*, op: Operation) -> str:
    """A shadow row's own terminal record: a comparison, never a receipt or outbox row."""
    try:
        comparison = operation_accept_shadow_terminal(
            operation_id=op.id, execution_epoch=op.execution_epoch,
            cancel_generation=op.cancel_generation, terminal_status=op.terminal_status,
            result_digest=op.result_digest,
        )
    except AcceptanceRefused as exc:
        operation_record_event(operation_id=op.id, kind="acceptance_refused",
                               data={"reason": exc.reason, "field": exc.field, "shadow": True})
        return "acceptance_refused"
    return f"shadow_accepted:{comparison.verdict}"


def _store_result(*, op: Operation, lease_owner: str, stored: dict[str, Any],
                  terminal_status: str) -> bool:
    digest = canonical_digest(stored)
    return operation_update_guarded(
        operation_id=op.id, state=State.FETCHING_RESULT, execution_epoch=op.execution_epoch,
        cancel_generation=op.cancel_generation, lease_owner=lease_owner,
        updates={"result": stored, "result_kind": stored["kind"], "result_digest": digest,
                 # Stays due (under our lease) until acceptance clears it: should acceptance
                 # fail, the row is re-claimed when the lease runs out, never stranded.
                 "terminal_status": terminal_status, "next_poll_at": timezone.now()},
        event_kind="result_fetched",
        event_data={"result_digest": digest, "kind": stored["kind"],
                    "is_error": stored["is_error"]},
    )


@operation_logged
def operation_fetch_and_accept(*, operation_id: uuid.UUID, lease_owner: str) -> str:
    op = Operation.objects.select_related("server").get(id=operation_id)
    if op.state == State.TERMINAL_OBSERVED:
        operation_transition(
            operation_id=op.id, from_state=State.TERMINAL_OBSERVED, to_state=State.FETCHING_RESULT,
            execution_epoch=op.execution_epoch, lease_owner=lease_owner,
            event_kind="fetching_result",
        )
        op.refresh_from_db()
    if op.state != State.FETCHING_RESULT:
        return "not_fetchable"
    if not op.result_digest:
        fetched: FetchedResult | None = None
        if op.terminal_status != "cancelled":
            # Nothing to fetch for cancelled (mcp-tasks.md section 5 point 4).
            try:
                fetched = server_call(
                    server=op.server, purpose="result",
                    fn=lambda adapter: adapter.fetch_result(remote_id=op.remote_id, timeout_s=30.0),
                    follow_up=True,
                )
            except RateLimited as limited:
                operation_reschedule_rate_limited(op=op, lease_owner=lease_owner, limited=limited)
                return "rate_limited"
            except NotFoundError as exc:
                from toolops.services.resolution import operation_classify_missing

                # No digest yet, so this classifies UNKNOWN: a status without its result is
                # never accepted.
                operation_classify_missing(op=op, lease_owner=lease_owner, cause="result_not_found",
                                           error=exc)
                return "result_not_found"
            except AdapterError as exc:
                operation_reschedule_after_error(
                    op=op, lease_owner=lease_owner, error=exc, kind="result_fetch_error"
                )
                return "result_fetch_error"
        try:
            stored = _stored_result(
                status=op.terminal_status, fetched=fetched, status_message=op.server_status_message
            )
        except ResultRejected as exc:
            operation_to_reconciliation(
                op=op, lease_owner=lease_owner, reason="result_rejected",
                evidence={"error": str(exc)},
            )
            return "result_rejected"
        # Tool output defense: a result that fails is never accepted as a success.
        defended = operation_defend_result(op=op, lease_owner=lease_owner, stored=stored,
                                           terminal_status=op.terminal_status)
        if defended is None:
            return "output_rejected"
        stored, status = defended
        if not _store_result(op=op, lease_owner=lease_owner, stored=stored, terminal_status=status):
            return "stale_lease"
    return _accept_from_row(operation_id=op.id)


@operation_logged
def operation_complete_sync(
    *, operation_id: uuid.UUID, lease_owner: str, result: FetchedResult
) -> str:
    """A synchronous answer carries its result: observe, store and accept it in one go."""
    op = Operation.objects.get(id=operation_id)
    status = "failed" if result.kind == "error" else "completed"
    try:
        operation_transition(
            operation_id=op.id, from_state=State.SUBMITTING, to_state=State.TERMINAL_OBSERVED,
            execution_epoch=op.execution_epoch, lease_owner=lease_owner,
            updates={"terminal_status": status, "next_poll_at": timezone.now()},
            event_kind="sync_result", event_data={"kind": result.kind, "is_error": result.is_error},
        )
        operation_transition(
            operation_id=op.id, from_state=State.TERMINAL_OBSERVED, to_state=State.FETCHING_RESULT,
            execution_epoch=op.execution_epoch, lease_owner=lease_owner, event_kind="fetching_result",
        )
    except IllegalTransition:
        return "stale"
    op.refresh_from_db()
    stored = _stored_result(status=status, fetched=result, status_message="")
    defended = operation_defend_result(op=op, lease_owner=lease_owner, stored=stored,
                                       terminal_status=status)
    if defended is None:
        return "output_rejected"
    stored, status = defended
    if not _store_result(op=op, lease_owner=lease_owner, stored=stored, terminal_status=status):
        return "stale_lease"
    outcome = _accept_from_row(operation_id=op.id)
    Operation.objects.filter(id=op.id, lease_owner=lease_owner).update(**RELEASE)
    return outcome
