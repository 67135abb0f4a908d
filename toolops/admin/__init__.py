"""Django admin pages whose actions call toolops services, one module per concern.

ledger/admin.py holds the pages that need nothing from toolops (receipts, outbox, servers,
organisations, memberships); the ledger cannot import toolops, so operations (cancel), the
reconciliation queue, input rounds, rollout and API tokens are registered here.
"""

from django.contrib import admin

from toolops.admin import (
    inputs,  # noqa: F401  (registers InputRequest and EffectReconciliation)
    operations,  # noqa: F401  (registers Operation: list, timeline page, cancel)
    reconciliation,  # noqa: F401  (registers ReconciliationItem)
    rollout,  # noqa: F401  (registers RolloutConfig, RolloutChange, ShadowComparison)
    tokens,  # noqa: F401  (replaces DRF's token admin: key shown once, organisation column)
)

admin.site.site_header = "toolops operations"
admin.site.site_title = "toolops"
admin.site.index_title = "Operations, reconciliation, input rounds"
# The lists are wide (what is stuck, since when, on which server and tool, who owns it); the
# sidebar would take a fifth of a 1400 px screen from them. The index page lists every model.
admin.site.enable_nav_sidebar = False
