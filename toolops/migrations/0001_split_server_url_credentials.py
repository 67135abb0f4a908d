"""Servers registered before credentials were kept apart from the URL: move userinfo and
token-like query parameters out of `ToolServer.url` into `ToolServer.credentials`, exactly as
registration does now (toolops/services/url_policy.py), so no stored URL carries a secret.

A row whose URL cannot be parsed is left as it is (the URL policy refuses it at the next connect).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def split_credentials(apps: Any, schema_editor: Any) -> None:
    from toolops.services.url_policy import UrlRefused, url_split_credentials

    ToolServer = apps.get_model("ledger", "ToolServer")
    for server in ToolServer.objects.all().only("id", "url", "credentials"):
        try:
            clean, found = url_split_credentials(server.url)
        except UrlRefused:
            continue
        if not found:
            continue
        credentials = dict(server.credentials or {})
        for part, values in found.items():
            credentials.setdefault(part, {}).update(values)
        ToolServer.objects.filter(id=server.id).update(url=clean, credentials=credentials)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0009_merge")]
    operations = [migrations.RunPython(split_credentials, migrations.RunPython.noop)]
