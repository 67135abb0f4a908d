"""The data migration that moves credentials out of servers' stored URLs."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from ledger.models import ToolServer

pytestmark = pytest.mark.django_db(transaction=True)


def _migrate(target: list[tuple[str, str | None]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(target)


def test_an_old_row_with_credentials_in_its_url_is_split() -> None:
    _migrate([("toolops", None)])
    old = ToolServer.objects.create(
        name="old", url="https://user:s3cret@tools.example.com/mcp?token=abc&region=eu",
        adapter_version="mcp-tasks/2025-11-25")
    plain = ToolServer.objects.create(name="plain", url="https://tools.example.com/mcp",
                                      adapter_version="mcp-tasks/2025-11-25")
    _migrate([("toolops", "0001_split_server_url_credentials")])
    old.refresh_from_db()
    plain.refresh_from_db()
    assert old.url == "https://tools.example.com/mcp?region=eu"
    assert "s3cret" not in old.url and "abc" not in old.url
    assert old.credentials["query"] == {"token": "abc"}
    assert old.credentials["headers"]["Authorization"].startswith("Basic ")
    assert plain.url == "https://tools.example.com/mcp" and not plain.credentials
