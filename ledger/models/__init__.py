"""Ledger models, one module per subdomain."""

from ledger.models.adapters import AdapterState
from ledger.models.due import OperationDue
from ledger.models.inputs import InputRequest
from ledger.models.operations import Operation, OperationEvent
from ledger.models.receipts import OutboxEvent, TerminalReceipt
from ledger.models.reconciliation import EffectReconciliation, ReconciliationItem
from ledger.models.rollout import RolloutChange, RolloutConfig, ShadowComparison
from ledger.models.servers import ToolServer
from ledger.models.tenancy import Membership, Organisation

__all__ = [
    "AdapterState",
    "EffectReconciliation",
    "InputRequest",
    "Membership",
    "Operation",
    "OperationDue",
    "OperationEvent",
    "Organisation",
    "OutboxEvent",
    "ReconciliationItem",
    "RolloutChange",
    "RolloutConfig",
    "ShadowComparison",
    "TerminalReceipt",
    "ToolServer",
]
