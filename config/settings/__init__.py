"""Settings split by concern; this module stitches them together."""

from config.settings.base import *  # noqa: F403
from config.settings.celery import *  # noqa: F403
from config.settings.toolops import *  # noqa: F403
from config.settings.api import *  # noqa: F403
