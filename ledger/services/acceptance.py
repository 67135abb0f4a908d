"""The one acceptance point: `operation_accept_terminal`.

It and its one-statement form (ledger.services.acceptance_one_statement, the same checks as
guards of the row's UPDATE) are the only code that writes a TerminalReceipt or an OutboxEvent
(tests/ledger/test_acceptance.py scans the source for any other writer). It runs in a durable
transaction (never nested inside a caller's), locks the operation row first (lock order: the
operation row, then the receipt and outbox inserts), re-checks every identity field against the
locked row, and only then writes the receipt, exactly one outbox row and the final state. The
database constraints (one receipt per call node and epoch, one outbox row per receipt) are the
backstop should two acceptors ever pass the checks at once.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from ledger.errors import AcceptanceRefused, OperationNotFound
from ledger.models import InputRequest, Operation, OperationEvent, OutboxEvent, TerminalReceipt
from ledger.services.events import (
    EventSpec,
    event_rows_insert_sql,
    event_rows_params,
    operation_record_event,
)
from ledger.services.inserts import one_statement_pair, row_insert, row_insert_statement
from ledger.services.shadow import shadow_comparisons_complete_locked
from ledger.services.terminal import (
    claim_check,
    final_state_for,
    operation_final_mirror,
    operation_finalize_locked,
    operation_finalized_event_locked,
)
from ledger.statements import statement_spelled
from ledger.states import TerminalStatus
from ledger.values import value_for_db

logger = logging.getLogger("ledger.acceptance")


def _accept_locked(
    *,
    operation_id: uuid.UUID,
    call_node_id: str,
    request_digest: str,
    remote_id: str,
    descriptor_version: str,
    execution_epoch: int,
    cancel_generation: int,
    terminal_status: str,
    result_digest: str,
    locked: Operation | None = None,
    written_final: bool = False,
    events_before: Sequence[EventSpec] = (),
) -> TerminalReceipt:
    # `locked`: the caller's guarded UPDATE in this transaction already locked the row and read
    # its fields back (RETURNING); the checks below run against those, not against the claim.
    # `written_final`: that UPDATE also wrote the final state (from `locked.state`, as it was
    # before), so only the `accepted` event is left to write; a refusal then leaves the caller's
    # transaction holding a final state without a receipt, which the caller must roll back.
    # `events_before`: with `written_final`, the events of that UPDATE's way to the final state,
    # left for this function to write with `accepted` (one INSERT).
    if events_before and not written_final:
        raise ValueError("events_before are written with the final state's event: written_final only")
    op = locked if locked is not None else (
        Operation.objects.select_for_update().filter(id=operation_id).first())
    if op is None:
        raise OperationNotFound(str(operation_id))
    if op.shadow:
        # Shadow rows never take a receipt slot and never reach the outbox: they are
        # settled by ledger.services.shadow.operation_accept_shadow_terminal.
        raise AcceptanceRefused("a shadow operation never gets a receipt", field="shadow")

    final_state = final_state_for(op=op, terminal_status=terminal_status)

    claim_check("call_node_id", op.call_node_id, call_node_id)
    claim_check("request_digest", op.request_digest, request_digest)
    claim_check("remote_id", op.remote_id, remote_id)
    claim_check("descriptor_version", op.descriptor_version, descriptor_version)
    claim_check("execution_epoch", op.execution_epoch, execution_epoch)
    claim_check("cancel_generation", op.cancel_generation, cancel_generation)
    claim_check("result_digest", op.result_digest, result_digest)

    cancelled = terminal_status == TerminalStatus.CANCELLED
    # The common cycle (its UPDATE wrote the final state; no shadow can wait on a task-mode row;
    # no input round to withdraw): the `accepted` event and the way's events go into the
    # receipt's own statement, with the receipt's key read from its CTE.
    accepted_data = {"terminal_status": terminal_status,
                     **_cancel_figures(op=op, cancelled=cancelled, now=timezone.now())}
    folded = written_final and op.execution_mode != "sync" and not op.input_round
    folded_events = None
    if folded:
        folded_events = [*events_before, EventSpec(
            kind="accepted", from_state=op.state, to_state=final_state, data=accepted_data)]
    # ON CONFLICT DO NOTHING rather than a caught IntegrityError: a second receipt for the call
    # node and epoch (or the operation) is refused without aborting the transaction, so the
    # caller's transaction goes on to record the refusal without a savepoint around this block.
    receipt, events_written = _receipt_with_outbox_insert(receipt=TerminalReceipt(
        operation=op,
        tenant=op.tenant,
        call_node_id=op.call_node_id,
        execution_epoch=op.execution_epoch,
        terminal_status=terminal_status,
        request_digest=op.request_digest,
        remote_id=op.remote_id,
        descriptor_version=op.descriptor_version,
        cancel_generation=op.cancel_generation,
        result_digest=op.result_digest,
        # A cancelled call has no success payload; anything fetched joins the audit record.
        payload=None if cancelled else op.result,
        audit={"result_kind": op.result_kind, "late_result": op.result} if cancelled else {},
    ), outbox_payload={
        "operation_id": str(op.id),
        "call_node_id": op.call_node_id,
        "execution_epoch": op.execution_epoch,
        "terminal_status": terminal_status,
        "result_digest": op.result_digest,
        "payload": None if cancelled else op.result,
    }, op=op, events=folded_events)
    if receipt is None:
        raise AcceptanceRefused(
            f"a receipt already exists for call node {op.call_node_id} epoch {op.execution_epoch}",
            field="receipt",
        )
    if events_written:
        operation_final_mirror(op=op, final_state=final_state, terminal_status=terminal_status)
        return receipt

    # Shadows of this call that finished first wait for this receipt to be compared. Only a
    # synchronous (legacy) call ever has a shadow (toolops/services/submit.py: shadow_submit
    # refuses any other), so a task-mode row skips the probe.
    if op.execution_mode == "sync":
        shadow_comparisons_complete_locked(legacy=op, receipt=receipt)
    # An ended operation's open input rounds can never be answered (however it ended: the
    # server's terminal state, a confirmed cancel, an operator's attested one). Same transaction
    # as the receipt, so no gate ever offers an answer for an accepted row. A row that never
    # opened a round has none (a round is created with the `input_round` bump, in one transaction).
    if op.input_round:
        input_rounds_withdraw(operation_id=op.id)
    event_data = {"receipt_id": receipt.pk, **accepted_data}
    if written_final:
        operation_finalized_event_locked(op=op, final_state=final_state,
                                         terminal_status=terminal_status, event_kind="accepted",
                                         event_data=event_data, before=events_before)
    else:
        operation_finalize_locked(op=op, final_state=final_state, terminal_status=terminal_status,
                                  event_kind="accepted", event_data=event_data)
    return receipt


def _receipt_with_outbox_insert(
    *, receipt: TerminalReceipt, outbox_payload: dict[str, Any], op: Operation,
    events: Sequence[EventSpec] | None,
) -> tuple[TerminalReceipt | None, bool]:
    """INSERT the receipt, skipping a conflict (one receipt per call node and epoch, and per
    operation: None, nothing written), and its one outbox row, whose payload is `outbox_payload`
    with the receipt's key as `receipt_id`; with `events`, also those events of `op` (the last,
    `accepted`, gets the receipt's key as `receipt_id` in its data). Returns the receipt and
    whether the events were written (else the caller writes them).

    On PostgreSQL one statement: the outbox and event INSERTs read the receipt's generated key
    from a data-modifying CTE and add it to their JSON (jsonb keeps no key order, so what is
    stored is what the separate statements write), and a skipped receipt leaves them nothing to
    read. The receipt was inserted just now, so its outbox row cannot conflict. The events'
    `max(seq)` is safe in this statement: the caller's guarded UPDATE took the row's lock before
    it began, so its snapshot holds every event committed under that lock. Elsewhere (SQLite, or
    a project listening to the models' save signals) separate statements."""
    connection = one_statement_pair(TerminalReceipt, OutboxEvent)
    if connection is None:
        inserted = row_insert(receipt, skip_conflict=True)
        if inserted is not None:
            row_insert(OutboxEvent(receipt=inserted,
                                   payload={"receipt_id": inserted.pk, **outbox_payload}))
        return inserted, False
    alias, receipt_sql, receipt_values, generated = row_insert_statement(receipt, skip_conflict=True)
    assert generated  # the receipt's key is the database's (BigAutoField)
    outbox = OutboxEvent(payload=outbox_payload)
    # Every column but the key, the receipt (read from the CTE) and the payload (completed there).
    columns = [f for f in OutboxEvent._meta.concrete_fields
               if f.attname not in ("id", "receipt_id", "payload")]
    values = [value_for_db(f, f.pre_save(outbox, True), connection) for f in columns]
    payload_value = value_for_db(OutboxEvent._meta.get_field("payload"), outbox_payload, connection)
    n = len(events or ())
    event_params = [] if not n else event_rows_params(
        connection=connection, operation_id=op.id, events=events or (),
        execution_epoch=op.execution_epoch, cancel_generation=op.cancel_generation,
        server_state=op.server_state)

    def spell() -> str:
        qn = connection.ops.quote_name
        names = ", ".join(qn(f.column) for f in columns)
        outbox_sql = (f"INSERT INTO {qn(OutboxEvent._meta.db_table)} "
                      f"({qn('receipt_id')}, {qn('payload')}, {names}) "
                      f"SELECT r.{qn('id')}, %s::jsonb || jsonb_build_object('receipt_id', "
                      f"r.{qn('id')}), {', '.join(['%s'] * len(columns))} FROM r")
        if not n:
            return f"WITH r AS ({receipt_sql}) {outbox_sql} RETURNING {qn('receipt_id')}"
        events_sql = event_rows_insert_sql(connection=connection, n=n, joined="r",
                                           last_data_from=("receipt_id", f"r.{qn('id')}"))
        return (f"WITH r AS ({receipt_sql}), o AS ({outbox_sql} RETURNING {qn('receipt_id')}), "
                f"e AS ({events_sql}) SELECT {qn('receipt_id')} FROM o")

    sql = statement_spelled(site="receipt_with_outbox_insert", shape=(alias, receipt_sql, n),
                            spell=spell)
    with connection.cursor() as cursor:
        cursor.execute(sql, [*receipt_values, payload_value, *values, *event_params])
        row = cursor.fetchone()
    if row is None:
        return None, False  # the receipt met a unique constraint: no row was written
    receipt.pk = row[0]
    receipt._state.adding = False
    receipt._state.db = alias
    return receipt, bool(n)


def input_rounds_withdraw(*, operation_id: uuid.UUID) -> int:
    """Open input rounds of an ended operation can no longer be answered."""
    return InputRequest.objects.filter(
        operation_id=operation_id, status=InputRequest.Status.OPEN
    ).update(status=InputRequest.Status.WITHDRAWN)


def _cancel_figures(*, op: Operation, cancelled: bool, now: datetime) -> dict[str, Any]:
    """For a row with a cancel request: whether the cancel won and how long confirmation took
    (request to accepted terminal), stored in the accepted event so a gate reads it from the ledger."""
    if op.cancel_generation == 0:
        return {}
    requested_at = (
        OperationEvent.objects.filter(operation_id=op.id, kind="cancel_requested",
                                      cancel_generation=op.cancel_generation)
        .values_list("created_at", flat=True).first()
    )
    figures: dict[str, Any] = {"cancel_outcome": "won" if cancelled else "lost"}
    if op.result_kind == "attested":
        # The server never confirmed: an operator settled the row from the queue. The latency
        # is the operator's, reported apart from the server's confirmation latency.
        figures["settled_by"] = "operator"
    if requested_at is not None:
        figures["cancel_confirmation_ms"] = round((now - requested_at).total_seconds() * 1000, 3)
    return figures


def operation_accept_terminal_within(
    *,
    operation_id: uuid.UUID,
    call_node_id: str,
    request_digest: str,
    remote_id: str,
    descriptor_version: str,
    execution_epoch: int,
    cancel_generation: int,
    terminal_status: str,
    result_digest: str,
    locked: Operation | None = None,
    written_final: bool = False,
    events_before: Sequence[EventSpec] = (),
) -> TerminalReceipt:
    """The same acceptance, inside the caller's durable transaction (the poll cycle that fetched
    and stored the result): one commit for the terminal answer, the result, the receipt and the
    outbox row. A refusal is raised before acceptance writes anything (the identity checks, and
    a receipt slot already taken, which the insert skips rather than failing on), so it needs no
    savepoint: it is recorded in the caller's transaction, and raises AcceptanceRefused; what the
    caller wrote before (the stored result) stays. Any other database error aborts the caller's
    transaction as a whole.

    `locked` is the row as the caller's guarded UPDATE in this transaction left it (its fields
    read back by that UPDATE, under its lock), which saves the select_for_update.

    `written_final`: that UPDATE also wrote the final state (one row version fewer); `locked`
    carries the state it came from, every check runs as above, and only the `accepted` event is
    written here. A refusal is then not recorded here: the caller's transaction holds a final
    state without a receipt and must be rolled back, and the caller records the refusal after.
    `events_before` are that UPDATE's events, left unwritten for the `accepted` event's INSERT
    (operation_transition_path's `events_out`).
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("operation_accept_terminal_within needs the caller's transaction")
    try:
        return _accept_locked(
            operation_id=operation_id, call_node_id=call_node_id,
            request_digest=request_digest, remote_id=remote_id,
            descriptor_version=descriptor_version, execution_epoch=execution_epoch,
            cancel_generation=cancel_generation, terminal_status=terminal_status,
            result_digest=result_digest, locked=locked, written_final=written_final,
            events_before=events_before,
        )
    except AcceptanceRefused as exc:
        if written_final:
            raise
        logger.warning("acceptance refused for %s: %s", operation_id, exc.reason)
        operation_record_event(
            operation_id=operation_id, kind="acceptance_refused",
            data={"reason": exc.reason, "field": exc.field, "claimed_status": terminal_status},
        )
        raise


def operation_accept_terminal(
    *,
    operation_id: uuid.UUID,
    call_node_id: str,
    request_digest: str,
    remote_id: str,
    descriptor_version: str,
    execution_epoch: int,
    cancel_generation: int,
    terminal_status: str,
    result_digest: str,
) -> TerminalReceipt:
    """Accept one terminal state, or raise AcceptanceRefused having changed nothing but the log."""
    try:
        with transaction.atomic(durable=True):
            return _accept_locked(
                operation_id=operation_id,
                call_node_id=call_node_id,
                request_digest=request_digest,
                remote_id=remote_id,
                descriptor_version=descriptor_version,
                execution_epoch=execution_epoch,
                cancel_generation=cancel_generation,
                terminal_status=terminal_status,
                result_digest=result_digest,
            )
    except AcceptanceRefused as exc:
        # The refused transaction rolled back; the refusal itself is recorded in its own.
        logger.warning("acceptance refused for %s: %s", operation_id, exc.reason)
        operation_record_event(
            operation_id=operation_id,
            kind="acceptance_refused",
            data={"reason": exc.reason, "field": exc.field, "claimed_status": terminal_status},
        )
        raise
