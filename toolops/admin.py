"""Admin pages whose actions call toolops services (ledger/admin.py cannot import toolops)."""

from toolops import (
    admin_inputs,  # noqa: F401  (registers InputRequest and EffectReconciliation)
    admin_reconciliation,  # noqa: F401  (registers ReconciliationItem)
    admin_rollout,  # noqa: F401  (registers RolloutConfig, RolloutChange, ShadowComparison)
)
