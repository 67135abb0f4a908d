"""toolops settings: the package's own defaults (toolops/defaults.py), overridable from the environment."""

from toolops.defaults import *  # noqa: F403
