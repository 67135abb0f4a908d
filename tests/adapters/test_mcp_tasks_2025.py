"""McpTasks2025Adapter over real HTTP against the reference server (official mcp 1.30 SDK).

One server and one negotiated session per module, as a deployment would have: the
session id is persisted and every later adapter instance reuses it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from adapters import (
    AlreadyTerminalError,
    LostResponseError,
    McpTasks2025Adapter,
    NotFoundError,
    RemoteTask,
    SessionLostError,
    TaskAdapter,
    TaskNotSupportedError,
    TransientError,
    adapter_for,
)
from adapters.mcp_tasks_2025_inputs import _INPUT_STREAMS, close_input_streams
from tests.peers.launch import peer_stats, running_reference_server

TERMINAL = {"completed", "failed", "cancelled"}


@pytest.fixture(autouse=True)
def _fresh_adapters() -> Iterator[None]:
    """Overrides the repo-wide fixture of this name: these tests need no Django."""
    yield


@pytest.fixture(scope="module")
def peer_url() -> Iterator[str]:
    with running_reference_server(poll_interval_ms=100) as url:
        yield url
        close_input_streams()


@pytest.fixture(scope="module")
def adapter(peer_url: str) -> Iterator[McpTasks2025Adapter]:
    a = McpTasks2025Adapter(url=peer_url, timeout_s=10.0)
    a.negotiate()
    a.list_tools()
    yield a
    a.close()


def key() -> str:
    return f"test-{uuid.uuid4()}"


def worker(adapter: McpTasks2025Adapter) -> McpTasks2025Adapter:
    """Another worker: a new adapter built from the persisted session id."""
    return McpTasks2025Adapter(url=adapter._rpc.url, session_id=adapter.session_id, timeout_s=10.0)


def submit(adapter: McpTasks2025Adapter, tool: str, **arguments: Any) -> RemoteTask:
    outcome = adapter.submit(tool=tool, arguments=arguments, ttl_ms=60_000, submission_key=key())
    assert outcome.task is not None, outcome
    assert outcome.sync_result is None
    return outcome.task


def wait_for(adapter: TaskAdapter, remote_id: str, statuses: set[str], timeout_s: float = 10.0) -> RemoteTask:
    deadline = time.monotonic() + timeout_s
    while True:
        task = adapter.get(remote_id=remote_id)
        if task.status in statuses or time.monotonic() > deadline:
            assert task.status in statuses, task
            return task
        time.sleep((task.poll_interval_ms or 100) / 1000)


def test_negotiate(adapter: McpTasks2025Adapter) -> None:
    negotiated = adapter.negotiated
    assert negotiated is not None
    assert negotiated.protocol_version == "2025-11-25"
    assert negotiated.session_id and negotiated.session_id == adapter.session_id
    assert negotiated.supports_task_tools_call and negotiated.supports_cancel and negotiated.supports_list
    assert negotiated.server_info["name"] == "toolops-reference-peer"
    assert "tasks" in negotiated.capabilities


def test_list_tools_reports_task_support(adapter: McpTasks2025Adapter) -> None:
    tools = {t.name: t for t in adapter.list_tools()}
    assert {n: t.task_support for n, t in tools.items()} == {
        "sleep_then_complete": "required",
        "sleep_then_fail": "required",
        "sleep_then_is_error": "required",
        "ask_input": "required",
        "quick_sync": "forbidden",
        "slow_sync": "forbidden",
        "read_value": "optional",
        "write_value": "optional",
    }
    assert tools["read_value"].raw["annotations"]["readOnlyHint"] is True
    assert tools["ask_input"].raw["execution"] == {"taskSupport": "required"}
    assert "execution" not in tools["quick_sync"].raw  # verbatim, defaults not filled in


def test_complete_then_fetch_result(adapter: McpTasks2025Adapter, peer_url: str) -> None:
    submission_key = key()
    outcome = adapter.submit(
        tool="sleep_then_complete",
        arguments={"seconds": 0.2, "value": "v1"},
        ttl_ms=60_000,
        submission_key=submission_key,
    )
    task = outcome.task
    assert task is not None and task.status == "working"
    assert (task.ttl_ms, task.poll_interval_ms) == (60_000, 100) and task.created_at
    assert peer_stats(peer_url)["submission_keys"].get(submission_key) == 1  # the key reached the server
    assert wait_for(adapter, task.remote_id, TERMINAL).status == "completed"
    result = adapter.fetch_result(remote_id=task.remote_id, timeout_s=5.0)
    assert (result.kind, result.is_error) == ("result", False)
    assert result.payload["content"] == [{"type": "text", "text": "v1"}]
    assert result.payload["structuredContent"] == {"value": "v1"}


def test_failed_task_gives_an_empty_result_and_a_status_message(adapter: McpTasks2025Adapter) -> None:
    task = submit(adapter, "sleep_then_fail", seconds=0.1, message="boom")
    final = wait_for(adapter, task.remote_id, TERMINAL)
    assert (final.status, final.status_message) == ("failed", "boom")
    result = adapter.fetch_result(remote_id=task.remote_id, timeout_s=5.0)
    assert (result.kind, result.is_error) == ("empty", False)  # mcp 1.30: `_meta`-only success


def test_is_error_result_completes(adapter: McpTasks2025Adapter) -> None:
    task = submit(adapter, "sleep_then_is_error", seconds=0.1, message="tool said no")
    assert wait_for(adapter, task.remote_id, TERMINAL).status == "completed"
    result = adapter.fetch_result(remote_id=task.remote_id, timeout_s=5.0)
    assert (result.kind, result.is_error) == ("result", True)
    assert result.payload["content"][0]["text"] == "tool said no"


def test_fetch_result_blocks_until_the_task_ends(adapter: McpTasks2025Adapter) -> None:
    task = submit(adapter, "sleep_then_complete", seconds=0.5, value="late")
    result = adapter.fetch_result(remote_id=task.remote_id, timeout_s=5.0)
    assert result.kind == "result" and result.payload["content"][0]["text"] == "late"


def test_unknown_task_id_is_not_found(adapter: McpTasks2025Adapter) -> None:
    with pytest.raises(NotFoundError) as info:
        adapter.get(remote_id="no-such-task")
    assert info.value.detail["jsonrpc_code"] == -32602
    with pytest.raises(NotFoundError):
        adapter.fetch_result(remote_id="no-such-task", timeout_s=5.0)


def test_call_sync(adapter: McpTasks2025Adapter) -> None:
    result = adapter.call_sync(
        tool="quick_sync", arguments={"value": "q"}, timeout_s=5.0, submission_key=key()
    )
    assert (result.kind, result.is_error, result.payload["content"]) == (
        "result",
        False,
        [{"type": "text", "text": "q"}],
    )


def test_call_sync_timeout_is_a_lost_response(adapter: McpTasks2025Adapter) -> None:
    with pytest.raises(LostResponseError):  # the call may have run: never Transient
        adapter.call_sync(tool="slow_sync", arguments={"seconds": 2}, timeout_s=0.3, submission_key=key())


def test_submit_to_a_tool_without_task_support(adapter: McpTasks2025Adapter, peer_url: str) -> None:
    before = peer_stats(peer_url)["tool_calls"].get("quick_sync", 0)
    # This instance listed the tools: it refuses without sending anything.
    with pytest.raises(TaskNotSupportedError):
        adapter.submit(tool="quick_sync", arguments={"value": "x"}, ttl_ms=60_000, submission_key=key())
    assert peer_stats(peer_url)["tool_calls"].get("quick_sync", 0) == before
    # A worker that never listed the tools sends it; mcp 1.30 answers with an isError result.
    other = worker(adapter)
    outcome = other.submit(tool="quick_sync", arguments={"value": "x"}, ttl_ms=60_000, submission_key=key())
    other.close()
    assert outcome.task is None and outcome.sync_result is not None
    assert outcome.sync_result.kind == "result" and outcome.sync_result.is_error


def test_session_is_shared_across_adapter_instances(adapter: McpTasks2025Adapter, peer_url: str) -> None:
    task = submit(adapter, "sleep_then_complete", seconds=0.2, value="shared")
    other = adapter_for(version="mcp-tasks/2025-11-25", url=peer_url, session_id=adapter.session_id)
    try:
        assert other.get(remote_id=task.remote_id).remote_id == task.remote_id
        assert wait_for(other, task.remote_id, TERMINAL).status == "completed"
    finally:
        other.close()
    fresh = McpTasks2025Adapter(url=peer_url)
    try:
        fresh.negotiate()
        assert fresh.session_id != adapter.session_id
        with pytest.raises(NotFoundError) as info:  # SDK servers bind tasks to the session
            fresh.get(remote_id=task.remote_id)
        assert not isinstance(info.value, SessionLostError)
        assert task.remote_id not in {t.remote_id for t in fresh.list_tasks()}
    finally:
        fresh.close()


def test_unknown_session_is_session_lost(adapter: McpTasks2025Adapter, peer_url: str) -> None:
    gone = McpTasks2025Adapter(url=peer_url, session_id="0" * 32)
    with pytest.raises(SessionLostError) as info:
        gone.get(remote_id="anything")
    assert info.value.detail["http_status"] == 404
    gone.close()


def test_ask_input_two_rounds_across_workers(adapter: McpTasks2025Adapter) -> None:
    task = submit(adapter, "ask_input", question="colour?", rounds=2)
    assert wait_for(adapter, task.remote_id, {"input_required"}).status == "input_required"
    answers = iter(["a", "b"])
    seen: list[str] = []
    result = None
    for _ in range(4):
        # Each round on a new adapter instance, as separate Celery tasks would do it.
        w = worker(adapter)
        try:
            window = w.read_input(remote_id=task.remote_id, wait_s=5.0)
            for request in window.requests:
                assert request.method == "elicitation/create"
                assert request.related_task_id == task.remote_id
                seen.append(request.params["message"])
                w.answer_input(
                    request_id=request.request_id,
                    result={"action": "accept", "content": {"value": next(answers)}},
                    remote_id=task.remote_id,
                )
            result = window.result
        finally:
            w.close()
        if result is not None:
            break
    assert seen == ["colour? (1/2)", "colour? (2/2)"]
    assert result is not None and result.kind == "result"
    assert result.payload["content"][0]["text"] == "answers: a,b"
    assert wait_for(adapter, task.remote_id, TERMINAL).status == "completed"
    fetched = adapter.fetch_result(remote_id=task.remote_id, timeout_s=5.0)
    assert fetched.payload["content"][0]["text"] == "answers: a,b"


def test_read_input_without_input_is_bounded(adapter: McpTasks2025Adapter, peer_url: str) -> None:
    task = submit(adapter, "sleep_then_complete", seconds=3, value="slow")
    started = time.monotonic()
    window = adapter.read_input(remote_id=task.remote_id, wait_s=0.5)
    assert window.requests == () and window.result is None
    assert time.monotonic() - started < 2.0
    # The stream is not held past the read: it was cancelled on the server and read to its end,
    # so no handler of ours is left to swallow a later request (docs/conformance.md).
    assert (peer_url, adapter.session_id, task.remote_id) not in _INPUT_STREAMS


def test_cancel_working_task_then_cancel_again(adapter: McpTasks2025Adapter) -> None:
    task = submit(adapter, "sleep_then_complete", seconds=5, value="never")
    cancelled = adapter.cancel(remote_id=task.remote_id)
    assert (cancelled.remote_id, cancelled.status) == (task.remote_id, "cancelled")
    assert adapter.get(remote_id=task.remote_id).status == "cancelled"
    with pytest.raises(AlreadyTerminalError):
        adapter.cancel(remote_id=task.remote_id)


def test_cancel_completed_task_is_already_terminal(adapter: McpTasks2025Adapter) -> None:
    task = submit(adapter, "sleep_then_complete", seconds=0.05, value="done")
    wait_for(adapter, task.remote_id, TERMINAL)
    with pytest.raises(AlreadyTerminalError) as info:
        adapter.cancel(remote_id=task.remote_id)
    assert info.value.detail["jsonrpc_code"] == -32602
    assert adapter.get(remote_id=task.remote_id).status == "completed"  # how a caller disambiguates


def test_list_tasks_shows_this_sessions_tasks(adapter: McpTasks2025Adapter) -> None:
    task = submit(adapter, "sleep_then_complete", seconds=0.05, value="listed")
    listed = {t.remote_id: t for t in adapter.list_tasks()}
    assert task.remote_id in listed
    assert listed[task.remote_id].created_at == task.created_at


def test_a_refused_stream_cancel_is_sent_once_let_out_so_the_next_round_is_not_swallowed(
        adapter: McpTasks2025Adapter) -> None:
    """The QPS gate refuses the release's `notifications/cancelled` (nothing sent): the release
    waits and sends it. Unsent, the official SDK server kept the `tasks/result` handler and
    delivered round 2, once, into the stream the reader had closed; no later read ever saw it."""
    task = submit(adapter, "ask_input", question="size?", rounds=2)
    assert wait_for(adapter, task.remote_id, {"input_required"}).status == "input_required"
    refused: list[str] = []

    def gate(what: str) -> None:
        if what == "notifications/cancelled" and not refused:
            refused.append(what)
            raise TransientError("QPS cap reached; nothing sent", retry_after=0.2)

    answers = iter(["s", "m"])
    seen: list[str] = []
    result = None
    for _ in range(4):
        w = worker(adapter)
        w.set_request_gate(gate)
        try:
            window = w.read_input(remote_id=task.remote_id, wait_s=5.0)
            for request in window.requests:
                seen.append(request.params["message"])
                w.answer_input(request_id=request.request_id, remote_id=task.remote_id,
                               result={"action": "accept", "content": {"value": next(answers)}})
            result = window.result
        finally:
            w.close()
        if result is not None:
            break
    assert refused == ["notifications/cancelled"]  # the first release met the refusal
    assert seen == ["size? (1/2)", "size? (2/2)"]
    assert result is not None and result.payload["content"][0]["text"] == "answers: s,m"
