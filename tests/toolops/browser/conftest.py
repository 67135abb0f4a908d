"""Browser tests: Playwright driving Debian's chromium against the web UI served the production way.

The server is a separate `manage.py runserver --nostatic` process (DEBUG off) on the test
database, so static files come from WhiteNoise out of a `collectstatic` directory, exactly as a
deployment serves them; nothing in this process answers for it. Every test records the requests
the browser sends to hosts other than the server's (the docs must work offline) and every
response with an error status. A failing test leaves a screenshot of its page in
var/browser-screenshots/ (TOOLOPS_BROWSER_SHOTS names another directory and keeps every shot).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import pytest
from django.db import connection

from tests.peers.launch import REPO_ROOT, _free_port, _stop

CHROMIUM = "/usr/bin/chromium"
# As root in a container: no sandbox; no GPU; /dev/shm may be small; no calls home at start.
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SHOTS = Path(os.environ.get("TOOLOPS_BROWSER_SHOTS", REPO_ROOT / "var" / "browser-screenshots"))



@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[FAILED] = report.failed
    return report


FAILED = pytest.StashKey[bool]()


@pytest.fixture(scope="session")
def static_root() -> Iterator[Path]:
    """`collectstatic` into a scratch directory, as a deployment does."""
    with tempfile.TemporaryDirectory(prefix="toolops-static-") as tmp:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "TOOLOPS_STATIC_ROOT": tmp,
               "DATABASE_URL": "sqlite:///:memory:"}
        subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"],
                       cwd=REPO_ROOT, env=env, check=True, timeout=300)
        yield Path(tmp)


def _database_url() -> str:
    s = connection.settings_dict
    who = quote(s["USER"] or "", safe="") + (f":{quote(s['PASSWORD'], safe='')}" if s["PASSWORD"] else "")
    return f"postgres://{who}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.fixture
def web_url(transactional_db: None, static_root: Path) -> Iterator[str]:
    """`manage.py runserver --nostatic` on the test database: WhiteNoise serves /static/.

    One per test: the tables are emptied between tests, which gives content types new ids that a
    longer-lived server would still hold in its cache.
    """
    database_url = _database_url()
    from django.conf import settings

    port = _free_port()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test",
           "TOOLOPS_TEST_DATABASE_URL": database_url,
           "TOOLOPS_TEST_BROKER_URL": settings.CELERY_BROKER_URL,
           # Production static files: the collected directory only, through WhiteNoise, DEBUG off.
           "TOOLOPS_STATIC_ROOT": str(static_root), "TOOLOPS_STATIC_FINDERS": "0", "DJANGO_DEBUG": "0"}
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    SHOTS.mkdir(parents=True, exist_ok=True)
    log = open(SHOTS / "web-server.log", "wb")  # kept: a 500's traceback is read from here
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", "--nostatic", f"127.0.0.1:{port}"],
        cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/admin/login/", timeout=2.0)
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("web server did not start:\n" + Path(log.name).read_text()) from None
                time.sleep(0.2)
        yield url
    finally:
        _stop(proc)
        log.close()


@dataclass
class Watched:
    """What the browser did beyond the page: foreign hosts asked, error responses seen."""

    origin: str
    foreign: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def on_request(self, request: Any) -> None:
        parts = urlsplit(request.url)
        local = parts.hostname in ("127.0.0.1", "localhost")
        if parts.scheme in ("http", "https", "ws", "wss") and not local:
            self.foreign.append(request.url)

    def on_response(self, response: Any) -> None:
        if response.status >= 400 and response.url.startswith(self.origin):
            self.errors.append(f"{response.status} {response.url}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium; "
                    ".ci/run does); Playwright's own browser download is not used")

    # While Playwright runs, its sync API keeps an event loop in this thread, and Django refuses
    # ORM calls under a running loop. The tests' own ORM calls (fixtures, checks, the database
    # flush between tests) are plain blocking calls made between browser steps, never from inside
    # that loop: allowed for exactly as long as Playwright runs.
    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as pw:
            instance = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            yield instance
            instance.close()
    finally:
        if before is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


@pytest.fixture
def page(request: pytest.FixtureRequest, browser: Any, web_url: str) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900}, base_url=web_url)
    context.set_default_timeout(20_000)
    page = context.new_page()
    watched = Watched(origin=web_url)
    page.on("request", watched.on_request)
    page.on("response", watched.on_response)
    page.watched = watched
    yield page
    if request.node.stash.get(FAILED, True):
        SHOTS.mkdir(parents=True, exist_ok=True)
        target = SHOTS / f"FAILED-{request.node.name}.png"
        try:
            page.screenshot(path=str(target), full_page=True)
            print(f"screenshot of the failing page: {target}")
        except Exception as exc:  # the page may be gone; the test's own error is what matters
            print(f"no screenshot ({exc})")
    context.close()


def shot(page: Any, name: str, *, full_page: bool = False) -> None:
    """Keep a screenshot of this page when TOOLOPS_BROWSER_SHOTS is set (docs/screenshots/)."""
    if os.environ.get("TOOLOPS_BROWSER_SHOTS"):
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=full_page)


def login(page: Any, *, username: str, password: str) -> None:
    page.goto("/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_selector("#user-tools")


def assert_clean(page: Any) -> None:
    """No request left the machine and nothing the server sent was an error."""
    assert page.watched.foreign == [], f"requests to other hosts: {page.watched.foreign}"
    assert page.watched.errors == [], f"error responses: {page.watched.errors}"
