"""Shadow terminal records and their comparison with the legacy call.

A shadow operation reaches its own terminal state but never a TerminalReceipt or an OutboxEvent:
`operation_accept_shadow_terminal` writes a ShadowComparison instead, in the same durable shape
as acceptance (row lock first, then the comparison insert). The comparison is completed by
whichever side finishes last: the shadow's acceptance if the legacy receipt already exists, or the
legacy acceptance (`shadow_comparisons_complete_locked`, called inside its transaction).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from ledger.digests import canonical_digest
from ledger.errors import AcceptanceRefused, OperationNotFound
from ledger.models import Operation, ShadowComparison, TerminalReceipt
from ledger.services.terminal import claim_check, final_state_for, operation_finalize_locked


def comparable_digest(result: Any) -> str:
    """Digest of what both paths must agree on: kind, error flag and payload without `_meta`.

    The stored result digest also covers the server's status message and the payload's `_meta`
    (MCP puts the related task id there), which differ between a synchronous answer and a task
    result for the very same outcome; they are transport, not outcome.
    """
    if not isinstance(result, dict):
        return canonical_digest(result)
    payload = result.get("payload")
    if isinstance(payload, dict):
        payload = {k: v for k, v in payload.items() if k != "_meta"}
    return canonical_digest({"kind": result.get("kind"), "is_error": result.get("is_error"),
                             "payload": payload})


def _verdict(comparison: ShadowComparison, legacy: Operation, receipt: TerminalReceipt) -> None:
    comparison.legacy_terminal_status = receipt.terminal_status
    comparison.legacy_result_digest = comparable_digest(legacy.result)
    same_status = comparison.legacy_terminal_status == comparison.shadow_terminal_status
    same_digest = comparison.legacy_result_digest == comparison.shadow_result_digest
    comparison.verdict = (ShadowComparison.Verdict.AGREE if same_status and same_digest
                          else ShadowComparison.Verdict.DISAGREE)
    comparison.detail = {"same_terminal_status": same_status, "same_result_digest": same_digest}
    comparison.compared_at = timezone.now()


def shadow_comparisons_complete_locked(*, legacy: Operation, receipt: TerminalReceipt) -> int:
    """Inside the legacy acceptance transaction: settle comparisons waiting for this receipt."""
    done = 0
    # Nearly every acceptance has no shadow: one plain statement finds that out before the ORM
    # builds the locking read.
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {ShadowComparison._meta.db_table} "  # table name, no user input
            "WHERE legacy_operation_id = %s AND verdict = %s LIMIT 1",
            [ShadowComparison._meta.get_field("legacy_operation").get_db_prep_value(legacy.id, connection),
             ShadowComparison.Verdict.PENDING.value])
        if cursor.fetchone() is None:
            return 0
    for comparison in ShadowComparison.objects.select_for_update().filter(
        legacy_operation_id=legacy.id, verdict=ShadowComparison.Verdict.PENDING
    ):
        _verdict(comparison, legacy, receipt)
        comparison.save()
        done += 1
    return done


def operation_accept_shadow_terminal(
    *, operation_id: uuid.UUID, execution_epoch: int, cancel_generation: int,
    terminal_status: str, result_digest: str, within: bool = False,
) -> ShadowComparison:
    """The shadow row's terminal record. Same guards as acceptance; never a receipt or outbox row.

    `within`: run inside the caller's durable transaction (a savepoint) instead of its own.
    """
    with transaction.atomic(durable=not within):
        op = Operation.objects.select_for_update().filter(id=operation_id).first()
        if op is None:
            raise OperationNotFound(str(operation_id))
        if not op.shadow or op.shadow_of_id is None:
            raise AcceptanceRefused("not a shadow operation", field="shadow")
        final_state = final_state_for(op=op, terminal_status=terminal_status)
        claim_check("execution_epoch", op.execution_epoch, execution_epoch)
        claim_check("cancel_generation", op.cancel_generation, cancel_generation)
        claim_check("terminal_status", op.terminal_status, terminal_status)
        claim_check("result_digest", op.result_digest, result_digest)
        try:
            comparison = ShadowComparison.objects.create(
                shadow_operation=op, legacy_operation_id=op.shadow_of_id,
                call_node_id=op.call_node_id, tool_name=op.tool_name,
                shadow_terminal_status=terminal_status,
                shadow_result_digest=comparable_digest(op.result),
            )
        except IntegrityError as exc:
            raise AcceptanceRefused("the shadow already has its record", field="shadow") from exc
        legacy = Operation.objects.get(id=op.shadow_of_id)
        receipt = TerminalReceipt.objects.filter(operation_id=legacy.id).first()
        if receipt is not None:
            _verdict(comparison, legacy, receipt)
            comparison.save()
        operation_finalize_locked(
            op=op, final_state=final_state, terminal_status=terminal_status,
            event_kind="shadow_accepted",
            event_data={"comparison_id": comparison.pk, "verdict": comparison.verdict},
        )
        return comparison
