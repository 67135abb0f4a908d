from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "Operation ledger"
    default_auto_field = "django.db.models.BigAutoField"
