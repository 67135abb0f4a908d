"""/metrics scraped from live server processes during an end-to-end run against the real peer.

Two `runserver` processes share one PROMETHEUS_MULTIPROC_DIR, as gunicorn workers would: the
process counters must sum across them, and the ledger-derived figures must be exact whichever
process (web, or this test acting as the poll worker) did the work.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from ledger.models import Operation, OperationEvent
from tests.toolops.api_fixtures import principal
from toolops import api
from toolops.runner import run_embedded
from toolops.services.servers import server_add

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 60.0
SCRAPE_TOKEN = "scrape-token-for-tests"
SCRAPE = {"Authorization": f"Bearer {SCRAPE_TOKEN}"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def web_processes() -> Iterator[list[str]]:
    """Two web processes on this test's database, sharing one multiprocess metrics directory."""
    s = connection.settings_dict
    db_url = f"postgres://{s['USER']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"
    with tempfile.TemporaryDirectory() as metrics_dir:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test",
               "TOOLOPS_TEST_DATABASE_URL": db_url, "PROMETHEUS_MULTIPROC_DIR": metrics_dir,
               "TOOLOPS_METRICS_TOKEN": SCRAPE_TOKEN}
        procs, urls = [], []
        try:
            for _ in range(2):
                port = _free_port()
                procs.append(subprocess.Popen(
                    [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload",
                     "--skip-checks"],
                    cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                ))
                urls.append(f"http://127.0.0.1:{port}")
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            for url in urls:
                while True:
                    try:
                        if httpx.get(f"{url}/metrics", headers=SCRAPE, timeout=5).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    assert time.monotonic() < deadline, f"{url} did not start"
                    time.sleep(0.2)
            yield urls
        finally:
            for p in procs:
                p.terminate()
                p.wait(10)


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{url}/metrics", headers=SCRAPE, timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.django_db(transaction=True)
def test_metrics_from_live_processes_during_an_end_to_end_run(mcp_url: str, web_processes: list[str]) -> None:
    server_add(name="ref", url=mcp_url)
    client = principal(username="alice", org="acme")
    auth = {"Authorization": client._credentials["HTTP_AUTHORIZATION"]}
    web_a, web_b = web_processes
    bodies = [{"server": "ref", "tool": "sleep_then_complete", "call_node_id": f"n-{i}",
               "arguments": {"seconds": 0.3, "value": "teal"}} for i in range(3)]
    # Two submissions through process A, one through B.
    for url, body in zip([web_a, web_a, web_b], bodies, strict=True):
        r = httpx.post(f"{url}/api/operations/", json=body, headers=auth, timeout=30)
        assert r.status_code == 201, r.text

    # Closed without the token, whatever else is sent.
    assert httpx.get(f"{web_b}/metrics", timeout=10).status_code == 401
    assert httpx.get(f"{web_b}/metrics", headers=auth, timeout=10).status_code == 401
    during = _scrape(web_b)
    assert _value(during, "toolops_operations", state="WORKING") == 3
    # Counted in two processes, summed by the multiprocess collector of either.
    assert _value(during, "toolops_api_submissions_total", outcome="created") == 3
    assert _value(during, "toolops_acceptance_latency_seconds_count") == 0

    run_embedded(until_idle=True, max_seconds=30)  # this process is the poll worker

    after = _scrape(web_a)
    assert _value(after, "toolops_operations", state="ACCEPTED") == 3
    assert _value(after, "toolops_operations", state="WORKING") == 0
    assert _value(after, "toolops_transitions_total", from_state="FETCHING_RESULT", to_state="ACCEPTED") == 3
    # A working poll is a counter on its row; a terminal one is an event.
    working_polls = sum(Operation.objects.values_list("polls_count", flat=True))
    polls = working_polls + OperationEvent.objects.filter(kind="terminal_observed").count()
    assert polls >= 3
    ok = _value(after, "toolops_poll_requests_total", server="ref", outcome="ok")
    terminal = _value(after, "toolops_poll_requests_total", server="ref", outcome="terminal")
    assert ok + terminal == polls and terminal == 3
    assert _value(after, "toolops_acceptance_latency_seconds_count") == 3
    assert _value(after, "toolops_acceptance_latency_seconds_bucket", le="0.1") == 0
    assert _value(after, "toolops_acceptance_latency_seconds_bucket", le="+Inf") == 3
    assert _value(after, "toolops_outbox_unpublished") == 3
    assert _value(after, "toolops_outbox_traceable_ratio") == 1.0
    assert _value(after, "toolops_reconciliation_open_items") == 0

    api.consume_outbox(handler=lambda *, event, idempotency_key: None)
    assert _value(_scrape(web_b), "toolops_outbox_unpublished") == 0
    # A replayed submission is counted as such, not as a new one. (A new call node: n-0 already
    # has its accepted attempt, and a call node gets a second attempt only after NOT_FOUND_SAFE.)
    replay = {**bodies[0], "call_node_id": "n-replay"}
    r = httpx.post(f"{web_b}/api/operations/", json=replay, headers={**auth, "Idempotency-Key": "k1"},
                   timeout=30)
    assert r.status_code == 201
    r = httpx.post(f"{web_a}/api/operations/", json=replay, headers={**auth, "Idempotency-Key": "k1"},
                   timeout=30)
    assert r.status_code == 200
    final = _scrape(web_a)
    assert _value(final, "toolops_api_submissions_total", outcome="created") == 4
    assert _value(final, "toolops_api_submissions_total", outcome="replayed") == 1


@pytest.mark.django_db
def test_reconciliation_and_cancel_figures_come_from_the_ledger() -> None:
    from datetime import timedelta

    from django.utils import timezone

    from ledger.models import ReconciliationItem
    from ledger.services.events import operation_record_event
    from tests.ledger.factories import OperationFactory
    from toolops.metrics import metrics_registry

    op = OperationFactory()
    item = ReconciliationItem.objects.create(operation=op, reason="r", deadline=timezone.now())
    ReconciliationItem.objects.filter(pk=item.pk).update(created_at=timezone.now() - timedelta(seconds=600))
    other = OperationFactory()
    ReconciliationItem.objects.create(operation=other, reason="r", deadline=timezone.now(),
                                      status=ReconciliationItem.Status.RESOLVED)
    operation_record_event(operation_id=op.id, kind="poll_error", data={})
    registry = metrics_registry()
    assert registry.get_sample_value("toolops_reconciliation_open_items") == 1
    age = registry.get_sample_value("toolops_reconciliation_oldest_open_age_seconds")
    assert age is not None and 600 <= age < 660
    assert registry.get_sample_value("toolops_poll_requests_total",
                                     {"server": op.server.name, "outcome": "error"}) == 1
    assert registry.get_sample_value("toolops_cancel_confirmation_latency_seconds_count") == 0


@pytest.mark.django_db
def test_metrics_closed_by_default_and_token_compared() -> None:
    from django.test import Client, override_settings

    client = Client()
    with override_settings(TOOLOPS_METRICS_TOKEN=""):
        assert client.get("/metrics").status_code == 404
        assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 404
    with override_settings(TOOLOPS_METRICS_TOKEN=SCRAPE_TOKEN):
        for header in ("", "Bearer wrong", f"Token {SCRAPE_TOKEN}", f"Bearer {SCRAPE_TOKEN}x",
                       SCRAPE_TOKEN):
            refused = client.get("/metrics", HTTP_AUTHORIZATION=header)
            assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")
            assert b"toolops_" not in refused.content
        ok = client.get("/metrics", HTTP_AUTHORIZATION=f"bearer {SCRAPE_TOKEN}")
        assert ok.status_code == 200 and b"toolops_operations" in ok.content


@pytest.mark.django_db
def test_tenant_server_names_are_labels_only_where_allowed() -> None:
    from django.test import override_settings

    from ledger.services.events import operation_record_event
    from tests.ledger.factories import OperationFactory, ToolServerFactory
    from toolops.metrics import metrics_registry, output_rejected_inc

    shared = ToolServerFactory(name="shared-search", tenant="")
    private = [ToolServerFactory(name=f"acme-secret-{i}", tenant="acme") for i in range(2)]
    for server in (shared, *private):
        operation_record_event(operation_id=OperationFactory(server=server).id, kind="poll_error",
                               data={})
    output_rejected_inc(server="acme-secret-0", policy="reconcile")

    def text() -> str:
        from prometheus_client import generate_latest
        return generate_latest(metrics_registry()).decode()

    with override_settings(TOOLOPS_METRICS_SERVER_LABELS="shared"):
        body = text()
        assert "acme-secret" not in body
        registry = metrics_registry()
        assert registry.get_sample_value("toolops_poll_requests_total",
                                         {"server": "shared-search", "outcome": "error"}) == 1
        # Both private servers' polls, folded into one series.
        assert registry.get_sample_value("toolops_poll_requests_total",
                                         {"server": "tenant", "outcome": "error"}) == 2
        assert (registry.get_sample_value("toolops_output_rejected_total",
                                          {"server": "tenant", "policy": "reconcile"}) or 0) >= 1
    with override_settings(TOOLOPS_METRICS_SERVER_LABELS="none"):
        body = text()
        assert "shared-search" not in body and "acme-secret" not in body
    with override_settings(TOOLOPS_METRICS_SERVER_LABELS="all"):
        assert "acme-secret-1" in text()
