"""Finding a task by submission key against the real SDK peer: what is proof, what is a candidate.

Plain Python (no Django), like the adapter itself.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from adapters import McpTasks2025Adapter, NeverCreatedError, SessionLostError
from adapters.base import ResendRequest, session_digest
from tests.peers.launch import peer_stats, running_reference_server

ARGS = {"seconds": 0.2, "value": "k"}


@pytest.fixture(autouse=True)
def _fresh_adapters() -> Iterator[None]:
    """Overrides the repo-wide fixture of this name: these tests need no Django."""
    yield


@pytest.fixture(scope="module")
def coop_url() -> Iterator[str]:
    with running_reference_server(cooperating="full") as url:
        yield url


@pytest.fixture(scope="module")
def dedup_url() -> Iterator[str]:
    with running_reference_server(cooperating="dedup") as url:
        yield url


def _adapter(url: str) -> tuple[McpTasks2025Adapter, dict[str, object]]:
    adapter = McpTasks2025Adapter(url=url)
    caps = adapter.negotiate().capabilities
    return adapter, caps


def _since() -> datetime:
    return datetime.now(tz=UTC) - timedelta(seconds=1)


def test_lookup_hit_is_the_task_created_for_the_key(coop_url: str) -> None:
    adapter, caps = _adapter(coop_url)
    key = secrets.token_hex(16)
    created = adapter.submit(tool="sleep_then_complete", arguments=ARGS, ttl_ms=60_000, submission_key=key)
    assert created.task is not None
    found = adapter.lookup_by_key(submission_key=key, created_after=_since(), server_capabilities=caps)
    assert found is not None and found.remote_id == created.task.remote_id
    assert peer_stats(coop_url)["submission_keys"][key] == 1  # a lookup is not a resend
    adapter.close()


def test_lookup_miss_fences_the_key_so_absence_is_proof(coop_url: str) -> None:
    adapter, caps = _adapter(coop_url)
    key = secrets.token_hex(16)
    with pytest.raises(NeverCreatedError):
        adapter.lookup_by_key(submission_key=key, created_after=_since(), server_capabilities=caps)
    before = peer_stats(coop_url)["tasks_created"]
    late = adapter.submit(tool="sleep_then_complete", arguments=ARGS, ttl_ms=60_000, submission_key=key)
    assert late.task is None and late.sync_result is not None and late.sync_result.is_error
    assert peer_stats(coop_url)["tasks_created"] == before
    adapter.close()


def test_key_found_in_another_session_is_unreachable_not_absent(coop_url: str) -> None:
    first, caps = _adapter(coop_url)
    key = secrets.token_hex(16)
    first.submit(tool="sleep_then_complete", arguments=ARGS, ttl_ms=60_000, submission_key=key)
    second, _ = _adapter(coop_url)  # a new session: tasks of the first are not gettable here
    with pytest.raises(SessionLostError) as lost:
        second.lookup_by_key(submission_key=key, created_after=_since(), server_capabilities=caps)
    assert lost.value.detail["remote_id"]
    first.close()
    second.close()


def test_dedup_resend_only_in_the_session_of_the_original(dedup_url: str) -> None:
    adapter, caps = _adapter(dedup_url)
    key = secrets.token_hex(16)
    created = adapter.submit(tool="sleep_then_complete", arguments=ARGS, ttl_ms=60_000, submission_key=key)
    assert created.task is not None
    resend = ResendRequest(tool="sleep_then_complete", arguments=ARGS, ttl_ms=60_000)
    same = session_digest(adapter.session_id)
    found = adapter.lookup_by_key(submission_key=key, created_after=_since(), server_capabilities=caps,
                                  submitted_session=same, resend=resend)
    assert found is not None and found.remote_id == created.task.remote_id
    stats = peer_stats(dedup_url)
    assert stats["submission_keys"][key] == 2 and stats["tasks_created"] >= 1
    before = stats["tasks_created"]
    # Another session, or no record of the session: no resend, no proof, no second task.
    assert adapter.lookup_by_key(submission_key=key, created_after=_since(), server_capabilities=caps,
                                 submitted_session="sha256:other", resend=resend) is None
    assert adapter.lookup_by_key(submission_key=key, created_after=_since(), server_capabilities=caps,
                                 submitted_session=None, resend=resend) is None
    stats = peer_stats(dedup_url)
    assert stats["submission_keys"][key] == 2 and stats["tasks_created"] == before
    adapter.close()


def test_plain_server_offers_no_proof_only_candidates(peer_url_plain: str) -> None:
    adapter, caps = _adapter(peer_url_plain)
    key = secrets.token_hex(16)
    since = _since()
    created = adapter.submit(tool="sleep_then_complete", arguments=ARGS, ttl_ms=60_000, submission_key=key)
    assert created.task is not None
    resend = ResendRequest(tool="sleep_then_complete", arguments=ARGS, ttl_ms=60_000)
    assert adapter.lookup_by_key(submission_key=key, created_after=since, server_capabilities=caps,
                                 submitted_session=session_digest(adapter.session_id), resend=resend) is None
    assert peer_stats(peer_url_plain)["submission_keys"][key] == 1  # undeclared dedup: never resent
    candidates = adapter.candidates_by_window(created_after=since,
                                              created_before=datetime.now(tz=UTC) + timedelta(seconds=1))
    assert created.task.remote_id in {c.remote_id for c in candidates}
    adapter.close()


@pytest.fixture(scope="module")
def peer_url_plain() -> Iterator[str]:
    with running_reference_server() as url:
        yield url
