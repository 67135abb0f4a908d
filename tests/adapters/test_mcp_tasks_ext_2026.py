"""Shape B adapter against the FastMCP + fastmcp-tasks reference server, over real HTTP.

Every lifecycle case the executor relies on, measured at the adapter level (plain Python,
no ledger): complete, fail, isError, input round, cancel wins, completion wins, unknown id,
expiry, submission with a lost answer, plus the extension's negotiation and error codes.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import httpx
import pytest

from adapters import (
    LostResponseError,
    NotFoundError,
    RemoteTask,
    TaskNotSupportedError,
    adapter_for,
)
from adapters.mcp_tasks_ext_2026 import EXTENSION, PROTOCOL_VERSION, McpTasksExt2026Adapter
from tests.peers.drop_proxy import dropping_proxy
from tests.peers.launch_ext import ext_peer_stats, running_ext_server

TERMINAL = {"completed", "failed", "cancelled"}


@pytest.fixture
def adapter(ext_url: str) -> Iterator[McpTasksExt2026Adapter]:
    with McpTasksExt2026Adapter(url=ext_url, timeout_s=10.0) as a:
        a.negotiate()
        yield a


def _key() -> str:
    return secrets.token_hex(16)


def _until(adapter: McpTasksExt2026Adapter, remote_id: str, statuses: set[str],
           limit_s: float = 15.0) -> RemoteTask:
    deadline = time.monotonic() + limit_s
    while True:
        task = adapter.get(remote_id=remote_id)
        if task.status in statuses:
            return task
        assert time.monotonic() < deadline, f"still {task.status}"
        time.sleep(0.05)


def _submit(adapter: McpTasksExt2026Adapter, tool: str, **arguments: object) -> RemoteTask:
    outcome = adapter.submit(tool=tool, arguments=dict(arguments), ttl_ms=None, submission_key=_key())
    assert outcome.task is not None and outcome.sync_result is None
    return outcome.task


def test_registry_builds_the_extension_adapter_by_version(ext_url: str) -> None:
    adapter = adapter_for(version="mcp-tasks-ext/2026-07-28", url=ext_url, session_id=None)
    try:
        assert isinstance(adapter, McpTasksExt2026Adapter)
    finally:
        adapter.close()


def test_negotiate_uses_server_discover_and_lists_tools(adapter: McpTasksExt2026Adapter) -> None:
    negotiated = adapter.negotiate()
    assert negotiated.protocol_version == PROTOCOL_VERSION
    assert negotiated.session_id is None
    assert EXTENSION in negotiated.capabilities["extensions"]
    assert negotiated.supports_task_tools_call and not negotiated.supports_list
    tools = {t.name: t for t in adapter.list_tools()}
    assert {"sleep_then_complete", "ask_input", "quick_sync"} <= set(tools)
    assert tools["sleep_then_complete"].task_support == "optional"  # the server decides


def test_complete_flat_create_reply_and_inline_result(adapter: McpTasksExt2026Adapter) -> None:
    task = _submit(adapter, "sleep_then_complete", seconds=0.2, value="teal")
    assert task.status == "working" and task.raw["resultType"] == "task"
    assert task.ttl_ms == 900_000 and task.poll_interval_ms == 100
    done = _until(adapter, task.remote_id, TERMINAL)
    assert done.status == "completed"
    assert done.result is not None and done.result.kind == "result" and not done.result.is_error
    assert done.result.payload["content"][0]["text"] == "teal"
    # fetch_result returns the inline result of that read (and reads again if not cached).
    assert adapter.fetch_result(remote_id=task.remote_id, timeout_s=5).payload == done.result.payload
    again = adapter.fetch_result(remote_id=task.remote_id, timeout_s=5)
    assert again.payload["content"][0]["text"] == "teal"


def test_fail_carries_the_jsonrpc_error_inline(adapter: McpTasksExt2026Adapter) -> None:
    task = _submit(adapter, "sleep_then_fail", seconds=0.1)
    done = _until(adapter, task.remote_id, TERMINAL)
    assert done.status == "failed" and done.status_message == "deliberate failure"
    assert done.result is not None and done.result.kind == "error" and done.result.is_error
    assert done.result.payload == {"code": -32000, "message": "deliberate failure"}


def test_is_error_is_a_completed_task(adapter: McpTasksExt2026Adapter) -> None:
    task = _submit(adapter, "sleep_then_is_error", seconds=0.1)
    done = _until(adapter, task.remote_id, TERMINAL)
    assert done.status == "completed"
    assert done.result is not None and done.result.kind == "result" and done.result.is_error


def test_input_round_keys_deduplicated_and_answered_with_tasks_update(
    adapter: McpTasksExt2026Adapter, ext_url: str
) -> None:
    runs_before = ext_peer_stats(ext_url)["runs"].get("ask_input", 0)
    task = _submit(adapter, "ask_input", question="Name?")
    waiting = _until(adapter, task.remote_id, {"input_required"})
    assert len(waiting.input_requests) == 1
    request = waiting.input_requests[0]
    assert request.method == "elicitation/create" and request.related_task_id == task.remote_id
    assert request.params["message"] == "Name?"
    # The same request reappears on every read until answered: same key each time.
    again = adapter.read_input(remote_id=task.remote_id, wait_s=0)
    assert [r.request_id for r in again.requests] == [request.request_id] and again.result is None
    adapter.answer_input(request_id=request.request_id, remote_id=task.remote_id,
                         result={"action": "accept", "content": {"name": "Luca"}})
    # Answered here: a read that still shows the key (eventual consistency) hands out nothing.
    assert adapter.read_input(remote_id=task.remote_id, wait_s=0).requests == ()
    # A duplicate answer for the same key is ignored by the server (ack, no second leg).
    adapter.answer_input(request_id=request.request_id, remote_id=task.remote_id,
                         result={"action": "accept", "content": {"name": "Other"}})
    done = _until(adapter, task.remote_id, TERMINAL)
    assert done.status == "completed"
    assert done.result is not None and done.result.payload["content"][0]["text"] == "Hello, Luca!"
    # One leg to ask, one leg after the answer: the duplicate started nothing.
    assert ext_peer_stats(ext_url)["runs"]["ask_input"] - runs_before == 2


def test_cancel_wins_ack_then_polling_shows_cancelled(adapter: McpTasksExt2026Adapter) -> None:
    task = _submit(adapter, "sleep_then_complete", seconds=3, value="late")
    after = adapter.cancel(remote_id=task.remote_id)  # an ack; the returned read may lag
    assert after.remote_id == task.remote_id and after.status in {"working", "cancelled"}
    done = _until(adapter, task.remote_id, TERMINAL)
    assert done.status == "cancelled" and done.result is None
    time.sleep(3.2)  # past the tool's own end: the status must stay cancelled
    assert adapter.get(remote_id=task.remote_id).status == "cancelled"


def test_completion_wins_cancel_of_a_finished_task_is_acked_and_changes_nothing(
    adapter: McpTasksExt2026Adapter,
) -> None:
    task = _submit(adapter, "sleep_then_complete", seconds=0.05, value="first")
    _until(adapter, task.remote_id, TERMINAL)
    after = adapter.cancel(remote_id=task.remote_id)
    assert after.status == "completed"
    assert after.result is not None and after.result.payload["content"][0]["text"] == "first"


def test_unknown_id_is_not_found_on_get_update_and_cancel(adapter: McpTasksExt2026Adapter) -> None:
    for call in (
        lambda: adapter.get(remote_id="no-such-task"),
        lambda: adapter.answer_input(request_id="k", result={"action": "cancel"}, remote_id="no-such-task"),
        lambda: adapter.cancel(remote_id="no-such-task"),
    ):
        with pytest.raises(NotFoundError) as info:
            call()
        assert info.value.detail["jsonrpc_code"] == -32602
        assert info.value.detail["http_status"] == 400


def test_expiry_after_ttl_reads_as_not_found() -> None:
    with running_ext_server(execution_ttl_ms=2500) as url, \
            McpTasksExt2026Adapter(url=url, timeout_s=10.0) as adapter:
        task = _submit(adapter, "sleep_then_complete", seconds=0.05, value="gone")
        assert _until(adapter, task.remote_id, TERMINAL).status == "completed"
        time.sleep(6.0)  # retention (execution_ttl) passes without a read
        with pytest.raises(NotFoundError):
            adapter.get(remote_id=task.remote_id)


def test_submission_with_a_lost_answer_is_lost_response_and_never_resent(ext_url: str) -> None:
    before = ext_peer_stats(ext_url)["runs"].get("sleep_then_complete", 0)
    with dropping_proxy(ext_url) as (proxy_url, plan), \
            McpTasksExt2026Adapter(url=proxy_url, timeout_s=10.0) as adapter:
        plan.method, plan.count = "tools/call", 1
        with pytest.raises(LostResponseError):
            adapter.submit(tool="sleep_then_complete", arguments={"seconds": 0.05, "value": "x"},
                           ttl_ms=None, submission_key=_key())
        assert plan.dropped == ["tools/call"]
    time.sleep(0.5)
    # The task WAS created upstream (maybe-created), and the adapter sent it exactly once.
    assert ext_peer_stats(ext_url)["runs"]["sleep_then_complete"] - before == 1


def test_sync_answer_and_call_sync_without_the_declaration(adapter: McpTasksExt2026Adapter) -> None:
    outcome = adapter.submit(tool="quick_sync", arguments={"value": "now"}, ttl_ms=None,
                             submission_key=_key())
    assert outcome.task is None and outcome.sync_result is not None
    assert outcome.sync_result.payload["content"][0]["text"] == "now"
    direct = adapter.call_sync(tool="quick_sync", arguments={"value": "d"}, timeout_s=5,
                               submission_key=_key())
    assert direct.kind == "result" and direct.payload["content"][0]["text"] == "d"


def test_missing_declaration_is_32021_task_not_supported(adapter: McpTasksExt2026Adapter) -> None:
    with pytest.raises(TaskNotSupportedError) as info:
        adapter.call_sync(tool="sleep_then_complete", arguments={"seconds": 0.05}, timeout_s=5,
                          submission_key=_key())
    assert info.value.detail["jsonrpc_code"] == -32021
    assert EXTENSION in info.value.detail["required_capabilities"]["extensions"]


def test_routing_headers_are_sent_and_checked(ext_url: str) -> None:
    """Mcp-Name must equal the taskId: the server refuses a mismatch with -32020."""
    with McpTasksExt2026Adapter(url=ext_url, timeout_s=10.0) as adapter:
        task = _submit(adapter, "sleep_then_complete", seconds=0.05)
    response = httpx.post(
        ext_url,
        json={"jsonrpc": "2.0", "id": 1, "method": "tasks/get",
              "params": {"taskId": task.remote_id, "_meta": {
                  "io.modelcontextprotocol/protocolVersion": PROTOCOL_VERSION,
                  "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}}}}},
        headers={"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": PROTOCOL_VERSION,
                 "Mcp-Method": "tasks/get", "Mcp-Name": "someone-else"},
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == -32020


def test_list_tasks_does_not_exist_in_the_extension(adapter: McpTasksExt2026Adapter) -> None:
    with pytest.raises(TaskNotSupportedError):
        adapter.list_tasks()
