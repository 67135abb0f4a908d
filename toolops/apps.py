from django.apps import AppConfig


class ToolopsConfig(AppConfig):
    name = "toolops"
    verbose_name = "toolops executor"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # An uncaught traceback on stderr passes the log's redaction patterns too.
        from toolops.logging import install_redacted_excepthook

        install_redacted_excepthook()
