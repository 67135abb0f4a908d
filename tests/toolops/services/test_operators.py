"""The first operator: superuser, organisation, membership and token, usable at once."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from ledger.models import Membership
from toolops.services.operators import BootstrapRefused, operator_bootstrap


@pytest.mark.django_db
def test_bootstrap_leaves_an_operator_who_can_use_the_api_and_admin() -> None:
    made = operator_bootstrap(username="ana", email="", password="s3cret-pw", organisation="Acme Ops")
    assert made.organisation == "acme-ops" and made.organisation_created
    user = User.objects.get(username="ana")
    assert user.is_superuser and user.check_password("s3cret-pw")
    assert Membership.objects.get(user=user).organisation.slug == "acme-ops"
    assert Client().get("/api/operations/", HTTP_AUTHORIZATION=f"Token {made.token}").status_code == 200
    assert Client().login(username="ana", password="s3cret-pw")


@pytest.mark.django_db
def test_bootstrap_refuses_an_existing_user_and_writes_nothing() -> None:
    operator_bootstrap(username="ana", email="", password="pw", organisation="acme")
    with pytest.raises(BootstrapRefused, match="already exists"):
        operator_bootstrap(username="ana", email="", password="pw", organisation="other")
    with pytest.raises(BootstrapRefused, match="password"):
        operator_bootstrap(username="bob", email="", password="", organisation="acme")
    assert not User.objects.filter(username="bob").exists()
    assert Membership.objects.count() == 1


@pytest.fixture
def password_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "pw-from-env")  # before `cli` copies the env


def test_bootstrap_command_prints_the_token_once_as_json(password_env: None,
                                                         cli: Callable[..., Any]) -> None:
    out = json.loads(cli("toolops_bootstrap", "--username", "ana", "--organisation", "acme").stdout)
    assert out["username"] == "ana" and out["organisation"] == "acme" and len(out["token"]) == 40
    again = cli("toolops_bootstrap", "--username", "ana", "--organisation", "acme", check=False)
    assert again.returncode != 0 and "already exists" in again.stderr
    assert out["token"] not in again.stdout + again.stderr
