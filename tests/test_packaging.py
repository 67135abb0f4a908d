"""`pip install toolops` gives a host Django project the `ledger` and `toolops` apps.

Builds the wheel from a copy of the sources (so no build/ or *.egg-info lands in the checkout),
installs it with its `reference-server` extra into a fresh venv, writes a minimal host project
outside the repository, and runs `manage.py check`, `manage.py migrate` and the demo there (the
reference server and every setting come from the installed package, none from this checkout).
Dependencies come from the configured indexes (the pip cache makes a second run quick).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("ledger", "adapters", "toolops")
METADATA = ("pyproject.toml", "README.md", "requirements.txt", "requirements-reference-server.txt")

# Slow by nature (a wheel build and a venv install): its own bound instead of the suite's 300 s.
pytestmark = [pytest.mark.packaging, pytest.mark.timeout(1200)]

HOST_SETTINGS = """
    from pathlib import Path

    from toolops.defaults import *  # noqa: F403  (every TOOLOPS_* setting, with its default)

    BASE_DIR = Path(__file__).resolve().parent.parent
    SECRET_KEY = "host-project-test-key"
    DEBUG = False
    ALLOWED_HOSTS = ["127.0.0.1"]
    INSTALLED_APPS = [
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
        "django.contrib.staticfiles",
        "rest_framework",
        "rest_framework.authtoken",
        "drf_spectacular",
        "ledger",
        "toolops",
    ]
    MIDDLEWARE = [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ]
    ROOT_URLCONF = "hostsite.urls"
    TEMPLATES = [{
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": [
            "django.template.context_processors.request",
            "django.contrib.auth.context_processors.auth",
            "django.contrib.messages.context_processors.messages",
        ]},
    }]
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "host.sqlite3"}}
    DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
    USE_TZ = True
    STATIC_URL = "static/"
    REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}
"""

HOST_URLS = """
    from django.contrib import admin
    from django.urls import include, path

    urlpatterns = [
        path("admin/", admin.site.urls),
        path("api/", include("toolops.rest.urls")),
    ]
"""

HOST_MANAGE = """
    import os
    import sys

    if __name__ == "__main__":
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hostsite.settings")
        from django.core.management import execute_from_command_line

        execute_from_command_line(sys.argv)
"""


def _run(cmd: list[str], *, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # No PYTHONPATH and a cwd outside the repository: only the installed package can be imported.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    return proc


def _build_wheel(tmp: Path) -> Path:
    src = tmp / "src"
    src.mkdir()
    for name in METADATA:
        shutil.copy2(REPO / name, src / name)
    for package in PRODUCT:
        shutil.copytree(REPO / package, src / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp / "dist"
    _run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-w", str(dist), "-q"], cwd=tmp)
    (wheel,) = dist.glob("toolops-*.whl")
    return wheel


def test_wheel_in_a_fresh_venv_serves_a_host_project_migrate_and_demo(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.startswith("toolops-")}
    assert tops == set(PRODUCT), tops  # no tests/, config/, benchmarks/
    assert "ledger/migrations/0001_initial.py" in names
    assert any(n.startswith("toolops/templates/") and n.endswith(".html") for n in names)
    assert "toolops/reference_server/app.py" in names

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", f"toolops[reference-server] @ {wheel.as_uri()}"],
         cwd=tmp_path, timeout=900)

    host = tmp_path / "host"
    (host / "hostsite").mkdir(parents=True)
    (host / "hostsite" / "__init__.py").write_text("")
    (host / "hostsite" / "settings.py").write_text(textwrap.dedent(HOST_SETTINGS))
    (host / "hostsite" / "urls.py").write_text(textwrap.dedent(HOST_URLS))
    (host / "manage.py").write_text(textwrap.dedent(HOST_MANAGE))

    where = _run([str(python), "-c", "import ledger, toolops, adapters, toolops.reference_server.app; "
                  "print(toolops.__file__)"], cwd=host).stdout
    assert str(venv) in where and str(REPO) not in where, where

    check = _run([str(python), "manage.py", "check"], cwd=host)
    assert "System check identified no issues" in check.stdout, check.stdout
    migrate = _run([str(python), "manage.py", "migrate", "-v1"], cwd=host)
    assert "Applying ledger.0001_initial... OK" in migrate.stdout, migrate.stdout
    # The apps' tables exist in the host's database and the command line is there.
    shown = _run([str(python), "manage.py", "toolops", "reconcile", "--list"], cwd=host)
    assert shown.stdout.strip() == "[]", shown.stdout
    demo = _run([str(python), "manage.py", "toolops", "demo"], cwd=host, timeout=300)
    assert "4/4 calls accepted" in demo.stdout, demo.stdout + demo.stderr
    assert str(host / "host.sqlite3") in demo.stdout
