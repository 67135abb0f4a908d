"""Admin registrations whose actions call toolops services (ledger/admin.py cannot import toolops)."""

from toolops import admin_reconciliation  # noqa: F401  (registers ReconciliationItem)
