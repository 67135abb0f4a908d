"""Tool output defense, the policy: a result that fails the checks (output_checks.py) is never
accepted as a success and never dropped. The reasons are recorded in the ledger and, per
TOOLOPS_OUTPUT_DEFENSE_POLICY, the operation goes to reconciliation or is accepted as failed.
"""

from __future__ import annotations

from typing import Any

from ledger.digests import canonical_digest
from ledger.models import Operation
from ledger.services.events import operation_record_event
from toolops.logging import get_logger
from toolops.metrics import output_rejected_inc
from toolops.services.output_checks import (
    POLICY_RECONCILE,
    DefenseVerdict,
    defense_policy,
    rejected_result,
    result_defend,
)
from toolops.services.reconcile import operation_to_reconciliation

__all__ = ["DefenseVerdict", "defense_policy", "operation_defend_result", "rejected_result", "result_defend"]


def operation_defend_result(
    *, op: Operation, lease_owner: str | None, stored: dict[str, Any], terminal_status: str,
    verdict: DefenseVerdict | None = None,
) -> tuple[dict[str, Any], str] | None:
    """Apply the pipeline and the policy to a fetched result before it is stored and accepted.

    Returns the (stored result, terminal status) to store and accept, or None when the operation
    was sent to reconciliation. Under the fail policy the stored result is replaced by the
    rejection record and the terminal status becomes `failed`, so the receipt can never present a
    rejected result as a success.
    """
    if verdict is None:  # else the caller ran the pipeline over this same result already
        verdict = result_defend(op=op, stored=stored, terminal_status=terminal_status)
    if verdict.ok:
        return stored, terminal_status
    digest = canonical_digest(stored)
    policy = defense_policy()
    output_rejected_inc(server=op.server.name, policy=policy)
    evidence = {"reasons": verdict.reasons, "rejected_result_digest": digest,
                "observed_status": terminal_status, "policy": policy}
    # Reasons stay in the ledger (they may quote result values); the log names only the count.
    get_logger("toolops.output_defense").warning(
        "result rejected by output defense", policy=policy, reason_count=len(verdict.reasons),
        rejected_result_digest=digest)
    if policy == POLICY_RECONCILE:
        # The rejected body is not stored in `result`: a stored digest would let a later resolution
        # accept it without passing the pipeline again. Its digest is the evidence.
        operation_to_reconciliation(op=op, lease_owner=lease_owner, reason="output_rejected",
                                    evidence=evidence)
        return None
    operation_record_event(operation_id=op.id, kind="output_rejected", data=evidence)
    return rejected_result(stored=stored, reasons=verdict.reasons, original_digest=digest), "failed"
