"""The web UI's static files are served without DEBUG, and the API docs ask no other host."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.test import Client

pytestmark = pytest.mark.django_db


def test_admin_and_docs_assets_are_served_with_debug_off() -> None:
    assert settings.DEBUG is False
    client = Client()
    for page in ("/admin/login/", "/api/docs/", "/api/redoc/"):
        html = client.get(page).content.decode()
        assets = re.findall(r'(?:href|src)="(/static/[^"]+)"', html)
        assert assets, page
        for asset in assets:
            response = client.get(asset)
            assert response.status_code == 200, asset
            b"".join(response.streaming_content if response.streaming else [response.content])


def test_docs_pages_name_no_other_host() -> None:
    client = Client()
    for page in ("/api/docs/", "/api/redoc/"):
        html = client.get(page).content.decode()
        assert not re.search(r'(?:href|src)="https?://', html), page
        assert "fonts.googleapis" not in html and "cdn.jsdelivr" not in html
