from django.apps import AppConfig


class ToolopsConfig(AppConfig):
    name = "toolops"
    verbose_name = "toolops executor"
    default_auto_field = "django.db.models.BigAutoField"
