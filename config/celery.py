"""The Celery app. Settings live in config/settings/celery.py under the CELERY_ namespace."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Django system checks run at deploy (`manage.py check`, `migrate`) and in web processes. In a
# worker they would import the whole URLconf (REST API, DRF, drf-spectacular: about half a second),
# delaying the first poll after every worker restart for nothing the worker uses.
os.environ.setdefault("CELERY_SKIP_CHECKS", "1")

app = Celery("toolops")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["toolops"])
