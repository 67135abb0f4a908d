"""Reads of the ledger, one module per entity. Services write; selectors only read.

The package re-exports every selector so `from ledger.selectors import operation_snapshot` works;
new code may import from the entity module (`ledger.selectors.operations`) directly.
"""

from ledger.selectors.inputs import input_request_get, input_requests_open, input_rounds_waiting
from ledger.selectors.operations import (
    operation_events,
    operation_find,
    operation_get,
    operation_snapshot,
    operations_open_count,
)
from ledger.selectors.reconciliation import (
    reconciliation_items_open,
    reconciliation_oldest_open_age_seconds,
    reconciliation_overdue_count,
)
from ledger.selectors.rollout import rollout_changes, shadow_report
from ledger.selectors.servers import server_get

__all__ = [
    "input_request_get",
    "input_requests_open",
    "input_rounds_waiting",
    "operation_events",
    "operation_find",
    "operation_get",
    "operation_snapshot",
    "operations_open_count",
    "reconciliation_items_open",
    "reconciliation_oldest_open_age_seconds",
    "reconciliation_overdue_count",
    "rollout_changes",
    "server_get",
    "shadow_report",
]
