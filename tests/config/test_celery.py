"""The Celery app: a plain `celery beat` runs without Django's models or the task modules, and
still publishes the dispatcher's tick, by name, to the dispatcher's own queue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from config.celery import beat_is_light, celery_subcommand

REPO = Path(__file__).resolve().parents[2]
BROKER = os.environ.get("TOOLOPS_TEST_BROKER_URL", "redis://127.0.0.1:6379/15")


@pytest.mark.parametrize(("argv", "expected"), [
    (["/venv/bin/celery", "-A", "config", "beat", "-s", "/tmp/x"], "beat"),
    (["/venv/lib/celery/__main__.py", "--app", "config", "worker", "-B"], "worker"),
    (["/venv/bin/celery", "-b", "redis://x", "-A", "config", "--workdir", "/srv", "beat"], "beat"),
    (["/venv/bin/celery", "--app=config", "inspect", "ping"], "inspect"),
    (["manage.py", "beat"], None),
    (["/venv/lib/somepkg/__main__.py", "beat"], None),
    (["/venv/bin/pytest", "tests"], None),
    ([], None),
])
def test_the_subcommand_is_read_past_celerys_own_options(argv: list[str], expected: str | None) -> None:
    assert celery_subcommand(argv) == expected


def test_only_a_plain_beat_is_light(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOOLOPS_BEAT_DJANGO", raising=False)
    assert beat_is_light(["celery", "-A", "config", "beat"])
    assert not beat_is_light(["celery", "-A", "config", "worker", "-B"])
    # A scheduler of its own may read Django models (django-celery-beat does).
    assert not beat_is_light(["celery", "-A", "config", "beat", "-S", "django_celery_beat.schedulers:X"])
    assert not beat_is_light(["celery", "-A", "config", "beat", "--scheduler=custom:Sched"])
    monkeypatch.setenv("TOOLOPS_BEAT_DJANGO", "1")
    assert not beat_is_light(["celery", "-A", "config", "beat"])


def _probe(argv: list[str]) -> dict[str, object]:
    """Import the app in a fresh interpreter whose argv is `argv` and load what beat and the worker
    load at start (the loader's default modules); report what got loaded."""
    code = (
        "import sys, json; sys.argv = json.loads(sys.argv[1]); import config.celery as c; "
        "c.app.loader.import_default_modules(); "
        "from django.apps import apps; "
        "print(json.dumps({'ready': apps.ready, 'models': 'ledger.models' in sys.modules, "
        "'adapters': 'adapters.mcp_tasks_2025' in sys.modules, "
        "'broker': c.app.conf.broker_url, 'route': c.app.conf.task_routes}))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "CELERY_BROKER_URL": BROKER}
    env.pop("TOOLOPS_BEAT_DJANGO", None)
    out = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_beat_process_loads_no_model_and_no_adapter_but_reads_the_settings() -> None:
    light = _probe(["/venv/bin/celery", "-A", "config", "beat"])
    assert light["ready"] is False and light["models"] is False and light["adapters"] is False
    assert light["broker"] == BROKER
    assert light["route"] == {"toolops.dispatch_due": {"queue": "toolops.dispatch"}}
    # The same start in a worker sets Django up and imports the tasks (and the adapters with them).
    worker = _probe(["/venv/bin/celery", "-A", "config", "worker"])
    assert worker["ready"] is True and worker["models"] is True and worker["adapters"] is True
    assert worker["route"] == light["route"]


def test_a_real_beat_publishes_the_dispatcher_tick_to_the_dispatch_queue(tmp_path: Path) -> None:
    client = redis.Redis.from_url(BROKER)
    client.flushdb()  # fails (never skips) when Redis is down
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "CELERY_BROKER_URL": BROKER,
           "PYTHONUNBUFFERED": "1"}
    env.pop("TOOLOPS_BEAT_DJANGO", None)
    log = tmp_path / "beat.log"
    with open(log, "wb") as out:
        beat = subprocess.Popen([sys.executable, "-m", "celery", "-A", "config", "beat",
                                 "-s", str(tmp_path / "schedule"), "-l", "INFO"],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and client.llen("toolops.dispatch") < 2:
            assert beat.poll() is None, log.read_text()
            time.sleep(0.1)
        assert client.llen("toolops.dispatch") >= 2, log.read_text()
        message = json.loads(client.lindex("toolops.dispatch", 0))  # type: ignore[arg-type]
        assert message["headers"]["task"] == "toolops.dispatch_due"
        assert message["headers"]["expires"] is not None  # a late tick is superseded, not run
        assert client.llen("celery") == 0  # never behind the polls' queue
    finally:
        beat.terminate()
        beat.wait(timeout=15)
