"""Admin pages whose actions call toolops services (ledger/admin.py stays read-only and service-free)."""

from toolops import admin_inputs  # noqa: F401  (registers InputRequest and EffectReconciliation)
