"""Django admin pages whose actions call toolops services, one module per concern.

ledger/admin.py holds the pages that need nothing from toolops (receipts, outbox, servers,
organisations, memberships); the ledger cannot import toolops, so operations (cancel), the
reconciliation queue, input rounds, rollout and API tokens are registered here.
"""

from toolops.admin import (
    inputs,  # noqa: F401  (registers InputRequest and EffectReconciliation)
    operations,  # noqa: F401  (registers Operation: list, timeline page, cancel)
    reconciliation,  # noqa: F401  (registers ReconciliationItem)
    rollout,  # noqa: F401  (registers RolloutConfig, RolloutChange, ShadowComparison)
    tokens,  # noqa: F401  (replaces DRF's token admin: key shown once, organisation column)
)
