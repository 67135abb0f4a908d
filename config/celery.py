"""The Celery app. Settings live in config/settings/celery.py under the CELERY_ namespace."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Django system checks run at deploy (`manage.py check`, `migrate`) and in web processes. In a
# worker they would import the whole URLconf (REST API, DRF, drf-spectacular: about half a second),
# delaying the first poll after every worker restart for nothing the worker uses.
os.environ.setdefault("CELERY_SKIP_CHECKS", "1")

# Celery's global options that take a value (`celery -A config beat`: "config" is not the command).
_VALUE_OPTIONS = frozenset({"-A", "--app", "-b", "--broker", "--result-backend", "--loader",
                            "--config", "--workdir"})


def celery_subcommand(argv: Sequence[str]) -> str | None:
    """The `celery` subcommand this process runs (`worker`, `beat`, ...), or None when the app
    is imported by anything else (Django, a test, `manage.py`)."""
    if not argv:
        return None
    program = os.path.basename(argv[0])
    # `celery ...`, or `python -m celery ...` (argv[0] is celery's own __main__.py).
    if program != "celery" and not (program == "__main__.py"
                                    and os.path.basename(os.path.dirname(argv[0])) == "celery"):
        return None
    skip = False
    for token in argv[1:]:
        if skip:
            skip = False
        elif token in _VALUE_OPTIONS:
            skip = True
        elif not token.startswith("-"):
            return token
    return None


def beat_is_light(argv: Sequence[str]) -> bool:
    """A plain `celery beat` only publishes the dispatcher's tick (by task name, routed by the
    settings): it needs neither Django's models nor the task modules. Loading them would cost
    beat about 50 MB of its 100 for nothing. A beat given its own scheduler (`-S`, such as
    django-celery-beat's, which reads Django models) or TOOLOPS_BEAT_DJANGO=1 loads everything."""
    if celery_subcommand(argv) != "beat" or os.environ.get("TOOLOPS_BEAT_DJANGO", "") in {"1", "true"}:
        return False
    return not any(token in {"-S", "--scheduler"} or token.startswith("--scheduler=")
                   for token in argv)


_LIGHT = beat_is_light(sys.argv)
if _LIGHT:
    # The fix-up would also put the working directory first on sys.path (celery found `config`
    # there only while importing it); the settings import the project's other packages.
    sys.path.insert(0, os.getcwd())
# An empty fix-up list leaves out Celery's Django fix-up, which calls django.setup() (every model,
# the admin's autodiscovery, the adapters through it) before beat's first tick.
app = Celery("toolops", fixups=[] if _LIGHT else None)
app.config_from_object("django.conf:settings", namespace="CELERY")
if not _LIGHT:
    app.autodiscover_tasks(["toolops"])
