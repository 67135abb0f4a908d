"""AIP-151 adapter against the in-repo fake (tests/peers/aip151_server.py), over real HTTP.

Every lifecycle case measured at the adapter level: complete, fail, input (refused: AIP-151
has none), cancel wins, completion wins (cancel loses the race), unknown name, expiry and
delete, submission with a lost answer (request_id resend), plus throttling and codes.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from adapters import (
    AdapterError,
    LostResponseError,
    NotFoundError,
    RemoteTask,
    TaskNotSupportedError,
    TransientError,
    adapter_for,
)
from adapters.aip151 import Aip151Adapter
from adapters.base import ResendRequest
from tests.peers.launch_aip import AIP_OPTIONS, aip_faults, aip_reset, aip_stats

TERMINAL = {"completed", "failed", "cancelled"}


@pytest.fixture
def adapter(aip_url: str) -> Iterator[Aip151Adapter]:
    aip_reset(aip_url)
    with Aip151Adapter(url=aip_url, options=AIP_OPTIONS, timeout_s=5.0) as a:
        yield a
    aip_reset(aip_url)


def _key() -> str:
    return secrets.token_hex(16)


def _submit(adapter: Aip151Adapter, key: str | None = None, **arguments: object) -> RemoteTask:
    outcome = adapter.submit(tool="render", arguments=dict(arguments), ttl_ms=None,
                             submission_key=key or _key())
    assert outcome.task is not None
    return outcome.task


def _until(adapter: Aip151Adapter, name: str, limit_s: float = 10.0) -> RemoteTask:
    deadline = time.monotonic() + limit_s
    while True:
        task = adapter.get(remote_id=name)
        if task.status in TERMINAL:
            return task
        assert time.monotonic() < deadline, f"still {task.status}"
        time.sleep(0.05)


def test_registry_builds_the_aip_adapter_with_options(aip_url: str) -> None:
    adapter = adapter_for(version="aip-151/v1", url=aip_url, session_id=None, options=AIP_OPTIONS)
    try:
        assert isinstance(adapter, Aip151Adapter)
        negotiated = adapter.negotiate()
        assert negotiated.protocol_version == "aip-151/v1" and negotiated.supports_list
        assert negotiated.capabilities["adapter_options"]["methods"]["render"]["path"].endswith("jobs:run")
        assert [t.name for t in adapter.list_tools()] == ["render"]
        assert adapter.list_tools()[0].task_support == "required"
    finally:
        adapter.close()


def test_complete_response_and_progress_metadata(adapter: Aip151Adapter, aip_url: str) -> None:
    key = _key()
    task = _submit(adapter, key, seconds=0.4, value="teal")
    assert task.status == "working" and task.remote_id.startswith("projects/p/locations/l/operations/")
    assert task.progress is not None and task.progress["@type"].endswith("JobMetadata")
    done = _until(adapter, task.remote_id)
    assert done.status == "completed" and done.progress == {**done.progress, "progressPercent": 100}
    assert done.result is not None and done.result.kind == "result" and not done.result.is_error
    assert done.result.payload == {"@type": "type.googleapis.com/toolops.fake.v1.JobResult", "value": "teal"}
    assert adapter.fetch_result(remote_id=task.remote_id, timeout_s=5).payload["value"] == "teal"
    assert aip_stats(aip_url)["names_by_request_id"][key] == task.remote_id


def test_fail_is_done_with_a_status_error(adapter: Aip151Adapter) -> None:
    task = _submit(adapter, seconds=0.1, outcome="error", errorCode=9, message="quota gone")
    done = _until(adapter, task.remote_id)
    assert done.status == "failed" and done.status_message == "quota gone"
    assert done.result is not None and done.result.kind == "error"
    assert done.result.payload == {"code": 9, "message": "quota gone", "details": []}


def test_already_done_on_create(adapter: Aip151Adapter) -> None:
    task = _submit(adapter, instant=True, value="now")
    assert task.status == "completed" and task.result is not None
    assert adapter.fetch_result(remote_id=task.remote_id, timeout_s=5).payload["value"] == "now"


def test_input_is_not_part_of_aip151(adapter: Aip151Adapter) -> None:
    task = _submit(adapter, seconds=0.1)
    with pytest.raises(TaskNotSupportedError):
        adapter.read_input(remote_id=task.remote_id, wait_s=0)
    with pytest.raises(TaskNotSupportedError):
        adapter.answer_input(request_id="x", result={}, remote_id=task.remote_id)


def test_cancel_wins_ack_first_then_done_with_code_1(adapter: Aip151Adapter) -> None:
    task = _submit(adapter, seconds=5, cancelDelaySeconds=0.3)
    after = adapter.cancel(remote_id=task.remote_id)
    assert after.status == "working"  # only an ack: the executor must keep polling
    done = _until(adapter, task.remote_id)
    assert done.status == "cancelled"
    assert done.result is not None and done.result.payload["code"] == 1


def test_completion_wins_when_cancel_loses_the_race(adapter: Aip151Adapter) -> None:
    task = _submit(adapter, seconds=0.5, value="won", cancelLoses=True)
    assert adapter.cancel(remote_id=task.remote_id).status == "working"
    done = _until(adapter, task.remote_id)
    assert done.status == "completed" and done.result is not None
    assert done.result.payload["value"] == "won"


def test_cancel_of_a_done_operation_is_harmless(adapter: Aip151Adapter) -> None:
    task = _submit(adapter, instant=True, value="kept")
    after = adapter.cancel(remote_id=task.remote_id)
    assert after.status == "completed" and after.result is not None
    assert after.result.payload["value"] == "kept"


def test_unknown_name_is_not_found(adapter: Aip151Adapter) -> None:
    with pytest.raises(NotFoundError) as info:
        adapter.get(remote_id="projects/p/locations/l/operations/nope")
    assert info.value.detail["status"] == "NOT_FOUND" and info.value.detail["reason"] == "OPERATION_NOT_FOUND"
    with pytest.raises(NotFoundError):
        adapter.cancel(remote_id="projects/p/locations/l/operations/nope")


def test_expiry_after_done_reads_as_not_found(adapter: Aip151Adapter) -> None:
    task = _submit(adapter, seconds=0.1, expireAfterSeconds=0.5)
    assert _until(adapter, task.remote_id).status == "completed"
    time.sleep(0.8)
    with pytest.raises(NotFoundError):
        adapter.get(remote_id=task.remote_id)


def test_delete_after_result_then_not_found_and_delete_again_is_success(adapter: Aip151Adapter) -> None:
    task = _submit(adapter, instant=True)
    adapter.delete(remote_id=task.remote_id)
    with pytest.raises(NotFoundError):
        adapter.get(remote_id=task.remote_id)
    adapter.delete(remote_id=task.remote_id)  # 404 = already gone = success


def test_lost_answer_is_recovered_by_resending_the_same_request_id(
    adapter: Aip151Adapter, aip_url: str
) -> None:
    key = _key()
    before = aip_stats(aip_url)["counters"]
    aip_faults(aip_url, dropAfterCommit=1)
    task = _submit(adapter, key, seconds=0.2, value="once")
    stats = aip_stats(aip_url)
    assert stats["counters"]["dropped_after_commit"] - before.get("dropped_after_commit", 0) == 1
    assert stats["create_requests"][key] == 2  # the dropped send and the resend
    assert stats["names_by_request_id"][key] == task.remote_id  # one operation, same name
    assert stats["counters"]["created"] - before["created"] == 1
    assert _until(adapter, task.remote_id).result.payload["value"] == "once"  # type: ignore[union-attr]


def test_lost_answers_on_every_attempt_end_as_lost_response_then_lookup_by_key(
    adapter: Aip151Adapter, aip_url: str
) -> None:
    key = _key()
    before = aip_stats(aip_url)["counters"]["created"]
    aip_faults(aip_url, dropAfterCommit=3)
    with pytest.raises(LostResponseError):
        _submit(adapter, key, seconds=0.2)
    found = adapter.lookup_by_key(
        submission_key=key, created_after=datetime.now(UTC),
        resend=ResendRequest(tool="render", arguments={"seconds": 0.2}, ttl_ms=None),
    )
    stats = aip_stats(aip_url)
    assert stats["create_requests"][key] == 4  # three lost sends, then the lookup
    assert stats["counters"]["created"] - before == 1
    assert stats["names_by_request_id"][key] == found.remote_id


def test_same_request_id_with_another_body_is_refused(adapter: Aip151Adapter) -> None:
    key = _key()
    _submit(adapter, key, seconds=0.1, value="a")
    with pytest.raises(AdapterError) as info:
        _submit(adapter, key, seconds=0.1, value="b")
    assert info.value.detail["status"] == "ALREADY_EXISTS"
    assert not isinstance(info.value, TransientError | NotFoundError)


def test_503_is_retried_in_call_honouring_retry_after(adapter: Aip151Adapter, aip_url: str) -> None:
    task = _submit(adapter, instant=True)
    aip_faults(aip_url, faults=[{"status": 503, "count": 1, "retryAfter": "1", "match": "get"}])
    started = time.monotonic()
    assert adapter.get(remote_id=task.remote_id).status == "completed"
    assert time.monotonic() - started >= 0.9  # waited the Retry-After before the retry
    assert aip_stats(aip_url)["counters"]["fault_503"] == 1


def test_429_is_not_retried_in_call_and_carries_retry_after(adapter: Aip151Adapter, aip_url: str) -> None:
    task = _submit(adapter, instant=True)
    aip_faults(aip_url, faults=[{"status": 429, "count": 1, "retryAfter": "date:3", "match": "get"}])
    with pytest.raises(TransientError) as info:
        adapter.get(remote_id=task.remote_id)
    assert info.value.detail["status"] == "RESOURCE_EXHAUSTED"
    assert info.value.retry_after is not None and 1.0 <= info.value.retry_after <= 3.5  # HTTP-date form
    assert adapter.get(remote_id=task.remote_id).status == "completed"


def test_create_503_every_time_is_maybe_created(adapter: Aip151Adapter, aip_url: str) -> None:
    aip_faults(aip_url, faults=[{"status": 503, "count": 3, "retryAfter": "0", "match": "create"}])
    with pytest.raises(LostResponseError):
        _submit(adapter, seconds=0.1)


def test_unimplemented_cancel_is_task_not_supported(adapter: Aip151Adapter, aip_url: str) -> None:
    task = _submit(adapter, seconds=1)
    aip_faults(aip_url, unimplemented=["cancel"])
    with pytest.raises(TaskNotSupportedError):
        adapter.cancel(remote_id=task.remote_id)
