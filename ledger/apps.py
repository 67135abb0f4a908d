from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "Operation ledger"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Timestamps read through psycopg's C parser where the values are UTC (ledger/pg_loaders.py).
        from ledger.pg_loaders import pg_loaders_connect

        pg_loaders_connect()
