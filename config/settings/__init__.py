"""Settings split by concern; this module stitches them together."""

from config.settings.api import *  # noqa: F403
from config.settings.base import *  # noqa: F403
from config.settings.celery import *  # noqa: F403
from config.settings.toolops import *  # noqa: F403

# Explicit, after every star import: the API's apps extend base's, and JSON logging replaces base's.
INSTALLED_APPS = [*INSTALLED_APPS, *API_INSTALLED_APPS]  # noqa: F405
LOGGING = API_LOGGING  # noqa: F405
MIDDLEWARE = [*API_MIDDLEWARE, *MIDDLEWARE]  # noqa: F405
