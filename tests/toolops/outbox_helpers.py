"""Accepted operations for outbox tests, made through the one acceptance point (never by hand)."""

from __future__ import annotations

from django.utils import timezone

from ledger.digests import canonical_digest
from ledger.models import Operation, TerminalReceipt
from ledger.services.acceptance import operation_accept_terminal
from ledger.states import State
from tests.ledger.factories import OperationFactory


def accepted_operation(**fields: object) -> tuple[Operation, TerminalReceipt]:
    result = {"kind": "result", "payload": {"content": [{"type": "text", "text": "ok"}]},
              "is_error": False, "status_message": ""}
    op = OperationFactory(state=State.FETCHING_RESULT, terminal_status="completed", result=result,
                          result_kind="result", result_digest=canonical_digest(result),
                          # A stored result awaiting acceptance stays due (op_open_row_scheduled).
                          next_poll_at=timezone.now(), **fields)
    receipt = operation_accept_terminal(
        operation_id=op.id, call_node_id=op.call_node_id, request_digest=op.request_digest,
        remote_id=op.remote_id, descriptor_version=op.descriptor_version,
        execution_epoch=op.execution_epoch, cancel_generation=op.cancel_generation,
        terminal_status="completed", result_digest=op.result_digest,
    )
    return op, receipt
