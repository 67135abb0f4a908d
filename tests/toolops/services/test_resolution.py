"""Submission uncertainty, 404 and expiry against the real SDK peer over HTTP.

Faults are injected in the real HTTP path: an httpx transport that forwards a tools/call to the
server and then drops its answer (the task exists, we never learn its id), or drops the request
before it is forwarded (nothing exists). Every test counts tasks on the server side.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.utils import timezone

from adapters import NotFoundError, adapter_for
from adapters.base import KEY_DEDUP_RESEND, KEY_LOOKUP, LIST_SCAN
from ledger.models import Operation, OperationEvent, ReconciliationItem, ToolServer
from ledger.services.transitions import operation_transition
from ledger.states import State
from tests.peers.fault_transport import DropToolsCall
from tests.peers.launch import peer_lookup, peer_stats, running_reference_server
from tests.toolops.helpers import submit_sleep
from toolops.errors import SubmitRefused
from toolops.qps import LocalTokenBucket, qps_bucket_replace, server_bucket_key
from toolops.runner import run_embedded
from toolops.services import connections
from toolops.services.dispatch import operations_claim_due
from toolops.services.observe import operation_poll
from toolops.services.reconcile import reconciliation_attach_remote_id
from toolops.services.results import _store_result, operation_record_terminal_seen
from toolops.services.servers import server_add
from toolops.services.settle_cycle import result_stored

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def coop_url() -> Iterator[str]:
    with running_reference_server(cooperating="full", poll_interval_ms=100) as url:
        yield url


@pytest.fixture(scope="module")
def dedup_url() -> Iterator[str]:
    with running_reference_server(cooperating="dedup", poll_interval_ms=100) as url:
        yield url


def _inject(monkeypatch: pytest.MonkeyPatch, fault: DropToolsCall) -> None:
    def faulty(**kwargs: Any) -> Any:
        return adapter_for(**{**kwargs, "transport": fault})

    monkeypatch.setattr(connections, "adapter_for", faulty)


def _settle() -> None:
    run_embedded(until_idle=True, max_seconds=30)


def test_capabilities_are_declared_per_server(mcp_url: str, coop_url: str, dedup_url: str) -> None:
    plain = server_add(name="plain", url=mcp_url)
    coop = server_add(name="coop", url=coop_url)
    dedup = server_add(name="dedup", url=dedup_url)
    adapter = connections.adapter_for_server(server=plain)
    assert adapter.key_resolution_modes(server_capabilities=plain.capabilities) == {LIST_SCAN}
    assert adapter.key_resolution_modes(server_capabilities=coop.capabilities) == {
        KEY_LOOKUP, KEY_DEDUP_RESEND, LIST_SCAN}
    assert adapter.key_resolution_modes(server_capabilities=dedup.capabilities) == {
        KEY_DEDUP_RESEND, LIST_SCAN}


def test_lost_answer_resolved_by_cooperating_lookup(coop_url: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    server = server_add(name="coop", url=coop_url)
    _inject(monkeypatch, DropToolsCall(forward=True))
    before = peer_stats(coop_url)["tasks_created"]
    op = submit_sleep(server, node="lost-coop", seconds=0.3)
    assert op.state == State.SUBMISSION_UNKNOWN and not op.remote_id
    assert op.next_poll_at is not None  # scheduled for its resolution pass
    created = peer_lookup(coop_url, op.submission_key)
    assert created is not None  # the server did create it: only the answer was lost
    _settle()
    op.refresh_from_db()
    assert op.state == State.ACCEPTED and op.remote_id == created
    resolved = OperationEvent.objects.get(operation=op, kind="submission_resolved")
    assert resolved.data["how"] == "key_lookup" and resolved.data["proof"] is True
    stats = peer_stats(coop_url)
    assert stats["tasks_created"] - before == 1  # zero second operations
    assert stats["submission_keys"][op.submission_key] == 1  # the lookup never re-sent the call


def test_lost_answer_resolved_by_dedup_resend_in_the_same_session(
        dedup_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    server = server_add(name="dedup", url=dedup_url)
    _inject(monkeypatch, DropToolsCall(forward=True))
    before = peer_stats(dedup_url)["tasks_created"]
    op = submit_sleep(server, node="lost-dedup", seconds=0.3)
    assert op.state == State.SUBMISSION_UNKNOWN
    lost = OperationEvent.objects.get(operation=op, kind="submission_unknown")
    assert lost.data["detail"]["session"].startswith("sha256:")  # never the session id itself
    _settle()
    op.refresh_from_db()
    assert op.state == State.ACCEPTED
    assert OperationEvent.objects.get(operation=op, kind="submission_resolved").data["how"] == "dedup_resend"
    stats = peer_stats(dedup_url)
    assert stats["submission_keys"][op.submission_key] == 2  # sent twice, same key
    assert stats["tasks_created"] - before == 1  # ...and the server made one task of it


def test_dedup_resend_is_refused_after_the_session_changed(
        dedup_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    server = server_add(name="dedup", url=dedup_url)
    _inject(monkeypatch, DropToolsCall(forward=True))
    before = peer_stats(dedup_url)["tasks_created"]
    op = submit_sleep(server, node="lost-dedup-new-session", seconds=0.3)
    # Another worker re-initialised: the same key in the new session would be a second task.
    from toolops.services.servers import server_renegotiate

    server_renegotiate(server_id=server.pk, stale_session_id=server.session_id)
    with override_resolution_deadline(0):
        _settle()
    op.refresh_from_db()
    assert op.state == State.RECONCILIATION_REQUIRED
    item = ReconciliationItem.objects.get(operation=op)
    assert item.reason == "submission_unknown_deadline"
    stats = peer_stats(dedup_url)
    assert stats["submission_keys"][op.submission_key] == 1 and stats["tasks_created"] - before == 1


def test_a_lookup_refused_by_the_qps_cap_comes_back_at_the_buckets_pace(
        coop_url: str, monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """No token for the lookup: nothing was sent, so nothing is recorded as asked, and the row
    is due again when the bucket can serve it, not after the lookup backoff (under a saturated
    cap the backoff lost every draw to the polls and the row reached its deadline unasked)."""
    # The submit's one token must reach the wire: on a loaded machine more than the default 50 ms
    # can pass between its grant and its send, and an abandoned grant leaves no token for 5 s,
    # so the submit would be refused before the lookup this test is about.
    settings.TOOLOPS_QPS_SEND_DEADLINE_SECONDS = 5.0
    bucket = LocalTokenBucket()
    qps_bucket_replace(bucket)
    try:
        server = server_add(name="coop-slow", url=coop_url, max_qps=0.2)
        _inject(monkeypatch, DropToolsCall(forward=True))
        key = server_bucket_key(server_id=server.pk)
        bucket.reset(key=key)  # full again after the session's initialisation
        op = submit_sleep(server, node="lost-coop-capped", seconds=0.3)
        assert op.state == State.SUBMISSION_UNKNOWN, list(
            OperationEvent.objects.filter(operation=op).values_list("kind", "data"))
        lookups = OperationEvent.objects.filter(operation=op, kind="submission_lookup")
        # The submit took the only token: the next one is about 5 s away.
        Operation.objects.filter(id=op.id).update(next_poll_at=timezone.now())
        assert op.id in operations_claim_due(owner="w1")
        before = timezone.now()
        assert operation_poll(operation_id=op.id, lease_owner="w1") == "rate_limited"
        op.refresh_from_db()
        assert op.state == State.SUBMISSION_UNKNOWN and op.lease_owner == ""
        assert not lookups.exists()  # nothing was asked
        assert op.next_poll_at is not None
        assert before + timedelta(seconds=1) < op.next_poll_at < before + timedelta(seconds=30)
    finally:
        qps_bucket_replace(None)


def override_resolution_deadline(seconds: float) -> Any:
    from django.test import override_settings

    return override_settings(TOOLOPS_SUBMISSION_RESOLUTION_SECONDS=seconds)


def test_lost_answer_without_cooperation_goes_to_the_queue_with_candidates(
        mcp_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    server = server_add(name="plain", url=mcp_url)
    _inject(monkeypatch, DropToolsCall(forward=True))
    before = peer_stats(mcp_url)["tasks_created"]
    op = submit_sleep(server, node="lost-plain", seconds=0.3)
    _settle()
    op.refresh_from_db()
    assert op.state == State.RECONCILIATION_REQUIRED and not op.remote_id
    item = ReconciliationItem.objects.get(operation=op, status="open")
    assert item.reason == "submission_unknown_no_lookup"
    candidates = [c["remote_id"] for c in item.evidence["detail"]["candidates"]]
    assert len(candidates) == 1  # the task our lost call created, found by its creation time
    assert peer_stats(mcp_url)["tasks_created"] - before == 1
    # An operator attaches it; normal polling resumes and accepts. Still one task.
    reconciliation_attach_remote_id(item_id=item.id, remote_id=candidates[0], actor="op1",
                                    reason="only candidate in the window, same tool timing")
    _settle()
    op.refresh_from_db()
    assert op.state == State.ACCEPTED and op.remote_id == candidates[0]
    stats = peer_stats(mcp_url)
    assert stats["tasks_created"] - before == 1 and stats["submission_keys"][op.submission_key] == 1


def test_never_created_is_proven_by_the_fencing_lookup_then_resubmitted(
        coop_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    server = server_add(name="coop", url=coop_url)
    fault = DropToolsCall(forward=False)
    _inject(monkeypatch, fault)
    before = peer_stats(coop_url)["tasks_created"]
    op = submit_sleep(server, node="never-created", seconds=0.3)
    assert op.state == State.SUBMISSION_UNKNOWN
    with pytest.raises(SubmitRefused):  # not proven yet: no new attempt for the call node
        submit_sleep(server, node="never-created", seconds=0.3)
    _settle()
    op.refresh_from_db()
    assert op.state == State.NOT_FOUND_SAFE
    event = OperationEvent.objects.get(operation=op, kind="never_created")
    assert event.data["classification"] == "NEVER_CREATED" and event.data["proof"] is True
    assert peer_stats(coop_url)["tasks_created"] == before
    # The fence: the original request arriving late can no longer create anything.
    late = adapter_for(version=server.adapter_version, url=coop_url, session_id=server.session_id)
    outcome = late.submit(tool="sleep_then_complete", arguments={"seconds": 0.1, "value": "late"},
                          ttl_ms=60_000, submission_key=op.submission_key)
    late.close()
    assert outcome.task is None and outcome.sync_result is not None and outcome.sync_result.is_error
    assert peer_stats(coop_url)["refused_fenced"] >= 1
    # Proven never created: a new attempt is allowed, and it is the only task of the call node.
    second = submit_sleep(server, node="never-created", seconds=0.3)
    assert second.state == State.WORKING and second.submission_key != op.submission_key
    _settle()
    second.refresh_from_db()
    assert second.state == State.ACCEPTED
    assert peer_stats(coop_url)["tasks_created"] - before == 1


def test_404_before_expiry_is_unknown_and_queued(mcp_url: str) -> None:
    server = server_add(name="plain", url=mcp_url)
    before = peer_stats(mcp_url)["tasks_created"]
    op = submit_sleep(server, node="gone-early", seconds=5)
    # The server forgets the task (a purge we do not control): here, an id it never issued.
    Operation.objects.filter(id=op.id).update(remote_id="no-such-task", next_poll_at=timezone.now())
    _settle()
    op.refresh_from_db()
    assert op.state == State.RECONCILIATION_REQUIRED
    item = ReconciliationItem.objects.get(operation=op)
    assert item.reason == "not_found_unknown" and item.evidence["detail"]["classification"] == "UNKNOWN"
    assert item.evidence["remote_id"] == "no-such-task"
    assert item.evidence["submission_key"] == op.submission_key
    assert timedelta(seconds=890) < item.deadline - item.created_at <= timedelta(seconds=901)
    assert peer_stats(mcp_url)["tasks_created"] - before == 1


def _wait_gone(server: ToolServer, remote_id: str, url: str) -> None:
    adapter = adapter_for(version=server.adapter_version, url=url, session_id=server.session_id)
    try:
        for _ in range(60):
            try:
                adapter.get(remote_id=remote_id)
            except NotFoundError:
                return
            time.sleep(0.1)
        raise AssertionError("the server never expired the task")
    finally:
        adapter.close()


def test_404_after_expiry_without_receipt_is_unknown(mcp_url: str) -> None:
    server = server_add(name="plain", url=mcp_url)
    before = peer_stats(mcp_url)["tasks_created"]
    op = submit_sleep(server, node="gone-late", seconds=0.1, ttl_ms=1000)
    # We did not look in time (e.g. workers down) and our own budget was still open.
    # (Not polled for a day, rather than unscheduled: op_open_row_scheduled forbids that.)
    Operation.objects.filter(id=op.id).update(next_poll_at=timezone.now() + timedelta(days=1),
                                              expires_at=timezone.now() + timedelta(hours=1))
    _wait_gone(server, op.remote_id, mcp_url)
    Operation.objects.filter(id=op.id).update(next_poll_at=timezone.now())
    _settle()
    op.refresh_from_db()
    assert op.state == State.RECONCILIATION_REQUIRED
    assert ReconciliationItem.objects.get(operation=op).reason == "not_found_unknown"
    assert not op.result_digest  # nothing was accepted on a guess
    assert peer_stats(mcp_url)["tasks_created"] - before == 1


def test_expired_ttl_without_terminal_state_is_unknown(mcp_url: str) -> None:
    server = server_add(name="plain", url=mcp_url)
    before = peer_stats(mcp_url)["tasks_created"]
    op = submit_sleep(server, node="ttl-ran-out", seconds=5)
    Operation.objects.filter(id=op.id).update(expires_at=timezone.now() - timedelta(seconds=1),
                                              next_poll_at=timezone.now())
    _settle()
    item = ReconciliationItem.objects.get(operation=op)
    assert item.reason in ("expired", "wait_budget_exhausted")
    assert item.evidence["detail"]["classification"] == "UNKNOWN"
    assert peer_stats(mcp_url)["tasks_created"] - before == 1


def test_expired_with_receipt_proceeds_to_acceptance(mcp_url: str) -> None:
    server = server_add(name="plain", url=mcp_url)
    before = peer_stats(mcp_url)["tasks_created"]
    op = submit_sleep(server, node="digested-then-expired", seconds=0.1, ttl_ms=1000)
    adapter = adapter_for(version=server.adapter_version, url=mcp_url, session_id=server.session_id)
    for _ in range(50):
        task = adapter.get(remote_id=op.remote_id)
        if task.status == "completed":
            break
        time.sleep(0.1)
    # Terminal state observed and result digested before expiry; acceptance had not run yet.
    owner = "t-owner"
    Operation.objects.filter(id=op.id).update(lease_owner=owner,
                                              lease_expires_at=timezone.now() + timedelta(minutes=1))
    operation_record_terminal_seen(operation_id=op.id, from_state=State.WORKING, lease_owner=owner,
                                   task=task)
    operation_transition(operation_id=op.id, from_state=State.TERMINAL_OBSERVED,
                         to_state=State.FETCHING_RESULT, execution_epoch=1, lease_owner=owner)
    fetched = adapter.fetch_result(remote_id=op.remote_id, timeout_s=10)
    adapter.close()
    op.refresh_from_db()
    assert _store_result(op=op, lease_owner=owner, terminal_status="completed",
                         stored=result_stored(status="completed", fetched=fetched, status_message=""))
    _wait_gone(server, op.remote_id, mcp_url)
    Operation.objects.filter(id=op.id).update(lease_owner="", lease_expires_at=None,
                                              next_poll_at=timezone.now(),
                                              expires_at=timezone.now() - timedelta(seconds=1))
    _settle()
    op.refresh_from_db()
    assert op.state == State.ACCEPTED
    classified = OperationEvent.objects.get(operation=op, kind="classified")
    assert classified.data["classification"] == "EXPIRED_WITH_RECEIPT"
    assert not ReconciliationItem.objects.filter(operation=op).exists()
    assert peer_stats(mcp_url)["tasks_created"] - before == 1


def test_lost_session_is_unknown_and_the_session_is_reinitialised(mcp_url: str) -> None:
    server = server_add(name="plain", url=mcp_url)
    before = peer_stats(mcp_url)["tasks_created"]
    op = submit_sleep(server, node="session-lost", seconds=3)
    old_session = server.session_id
    # The session ends on the server (SDK servers forget that session's tasks).
    httpx.delete(mcp_url, headers={"Mcp-Session-Id": old_session,
                                   "MCP-Protocol-Version": "2025-11-25"}, timeout=5).raise_for_status()
    Operation.objects.filter(id=op.id).update(next_poll_at=timezone.now())
    lease = "t-session"
    Operation.objects.filter(id=op.id).update(lease_owner=lease,
                                              lease_expires_at=timezone.now() + timedelta(minutes=1))
    assert operation_poll(operation_id=op.id, lease_owner=lease) == "not_found"
    op.refresh_from_db()
    assert op.state == State.RECONCILIATION_REQUIRED
    assert ReconciliationItem.objects.get(operation=op).reason == "session_lost"
    server.refresh_from_db()
    assert server.session_id and server.session_id != old_session  # re-initialised
    # New work runs in the new session; the lost task is never resubmitted.
    fresh = submit_sleep(server, node="after-session-loss", seconds=0.1)
    _settle()
    fresh.refresh_from_db()
    assert fresh.state == State.ACCEPTED
    stats = peer_stats(mcp_url)
    assert stats["tasks_created"] - before == 2
    assert stats["submission_keys"][op.submission_key] == 1
