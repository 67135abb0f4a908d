"""Fixtures shared by the toolops tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli(tmp_path: Path):  # type: ignore[no-untyped-def]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings",
           "DATABASE_URL": f"sqlite:///{tmp_path / 'cli.sqlite3'}",
           # The reference servers listen on loopback, which the default URL policy refuses.
           "TOOLOPS_SERVER_HOSTS": "public,127.0.0.0/8,::1,localhost"}
    env.pop("CELERY_BROKER_URL", None)

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"{args} failed: {proc.stderr}")
        return proc

    run("migrate", "-v0")
    return run
