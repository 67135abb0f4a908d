"""Fixtures shared by the toolops tests."""

from __future__ import annotations

import io
import logging.config
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from ledger.models import ToolServer
from toolops.logging import logging_config
from toolops.services.servers import server_add

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def server_options() -> dict[str, Any]:
    """Extra `server_add` arguments for the `server` row; a test module overrides this fixture."""
    return {}


@pytest.fixture
def server(mcp_url: str, server_options: dict[str, Any]) -> ToolServer:
    """The reference server registered as "ref" (negotiated over HTTP, as in production)."""
    return server_add(name="ref", url=mcp_url, **server_options)


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


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    """What the project's JSON logging config writes, captured; the settings' config is restored."""
    out = io.StringIO()
    config = logging_config(level="INFO")
    config["handlers"]["console"]["stream"] = out
    logging.config.dictConfig(config)
    yield out
    logging.config.dictConfig(settings.LOGGING)
