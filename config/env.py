"""Environment parsing for this repository's project: the package's helpers, plus its base dir."""

from __future__ import annotations

from pathlib import Path

from toolops.env import env_bool, env_float, env_int, env_str

BASE_DIR = Path(__file__).resolve().parent.parent

__all__ = ["BASE_DIR", "env_bool", "env_float", "env_int", "env_str"]
