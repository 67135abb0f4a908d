"""The lifecycle through the executor (operation_submit + run_embedded) for the two new shapes.

Each case runs over real HTTP against the shape's reference server: the FastMCP +
fastmcp-tasks peer (Shape B) and the in-repo AIP-151 fake. Cases the executor does not own
yet (input rounds and the cancel flow; submission-unknown resolution) are
measured at the adapter level in tests/adapters/.
"""

from __future__ import annotations

import time

import pytest

from adapters.aip151 import Aip151Adapter
from ledger.models import Operation, ToolServer
from ledger.selectors import operation_snapshot
from ledger.states import State
from tests.peers.drop_proxy import dropping_proxy
from tests.peers.launch_aip import AIP_OPTIONS, aip_faults, aip_stats
from tests.peers.launch_ext import ext_peer_stats, running_ext_server
from tests.toolops.fixtures_lifecycle import lifecycle_settle as _settle
from tests.toolops.fixtures_lifecycle import lifecycle_submit as _submit
from toolops.runner import run_embedded
from toolops.services.servers import server_add

pytestmark = pytest.mark.django_db


def _receipt(op: Operation) -> dict[str, object]:
    snap = operation_snapshot(operation_id=op.id)
    assert snap["state"] == State.ACCEPTED, snap["state"]
    assert len(snap["outbox"]) == 1
    kinds = [e["kind"] for e in snap["events"]]
    assert kinds.index("result_fetched") < kinds.index("accepted")  # never on status alone
    receipt = snap["receipt"]
    assert receipt["result_digest"] == snap["result_digest"] != ""
    return dict(receipt)


# -- Shape B: mcp-tasks-ext/2026-07-28 ---------------------------------------------------------


def test_ext_server_add_stores_the_extension_and_no_session(ext_server: ToolServer) -> None:
    assert ext_server.protocol_version == "2026-07-28" and ext_server.session_id == ""
    assert "io.modelcontextprotocol/tasks" in ext_server.capabilities["extensions"]
    assert ext_server.tools["sleep_then_complete"]["task_support"] == "optional"


def test_ext_complete(ext_server: ToolServer) -> None:
    op = _submit(ext_server, "sleep_then_complete", "ext-complete", seconds=0.2, value="teal")
    assert op.state == State.WORKING and op.remote_id and op.adapter_version == "mcp-tasks-ext/2026-07-28"
    _settle()
    receipt = _receipt(op)
    assert receipt["terminal_status"] == "completed"
    assert receipt["payload"]["payload"]["content"][0]["text"] == "teal"  # type: ignore[index]


def test_ext_fail_inline_error(ext_server: ToolServer) -> None:
    op = _submit(ext_server, "sleep_then_fail", "ext-fail", seconds=0.1)
    _settle()
    receipt = _receipt(op)
    assert receipt["terminal_status"] == "failed"
    assert receipt["payload"]["kind"] == "error"  # type: ignore[index]
    assert receipt["payload"]["payload"]["code"] == -32000  # type: ignore[index]


def test_ext_is_error_is_completed(ext_server: ToolServer) -> None:
    op = _submit(ext_server, "sleep_then_is_error", "ext-iserror", seconds=0.1)
    _settle()
    receipt = _receipt(op)
    assert receipt["terminal_status"] == "completed"
    assert receipt["payload"]["is_error"] is True  # type: ignore[index]


def test_ext_server_decides_sync_answer_is_accepted_without_a_task(ext_server: ToolServer) -> None:
    op = _submit(ext_server, "quick_sync", "ext-sync", value="now")
    assert op.remote_id == ""
    receipt = _receipt(op)
    assert receipt["terminal_status"] == "completed"
    assert receipt["payload"]["payload"]["content"][0]["text"] == "now"  # type: ignore[index]


def test_ext_input_required_pauses_polling(ext_server: ToolServer) -> None:
    op = _submit(ext_server, "ask_input", "ext-input", question="Name?")
    deadline = time.monotonic() + 15
    while Operation.objects.get(id=op.id).state != State.INPUT_REQUIRED:
        assert time.monotonic() < deadline
        run_embedded(until_idle=True, max_seconds=1)
    op.refresh_from_db()
    assert op.server_state == "input_required" and op.next_poll_at is None


def test_ext_unknown_id_goes_to_reconciliation(ext_server: ToolServer) -> None:
    op = _submit(ext_server, "sleep_then_complete", "ext-unknown", seconds=0.2)
    # The server no longer knows the id we hold (e.g. lost across a memory-backend restart).
    Operation.objects.filter(id=op.id).update(remote_id="unknown-" + op.remote_id)
    _settle()
    snap = operation_snapshot(operation_id=op.id)
    assert snap["state"] == State.RECONCILIATION_REQUIRED and snap["receipt"] is None
    reasons = [e["data"].get("reason") for e in snap["events"] if e["kind"] == "reconciliation_required"]
    assert reasons == ["not_found_unknown"]


def test_ext_expiry_before_observation_goes_to_reconciliation() -> None:
    with running_ext_server(execution_ttl_ms=2000) as url:
        server = server_add(name="ext-ttl", url=url, adapter_version="mcp-tasks-ext/2026-07-28")
        op = _submit(server, "sleep_then_complete", "ext-expiry", seconds=0.05)
        time.sleep(5.0)  # completed and purged before the executor looks
        _settle()
    snap = operation_snapshot(operation_id=op.id)
    assert snap["state"] == State.RECONCILIATION_REQUIRED and snap["receipt"] is None


def test_ext_submission_with_a_lost_answer_is_unknown_and_not_resent(ext_url: str) -> None:
    before = ext_peer_stats(ext_url)["runs"].get("sleep_then_complete", 0)
    with dropping_proxy(ext_url) as (proxy, plan):
        server = server_add(name="ext-lossy", url=proxy, adapter_version="mcp-tasks-ext/2026-07-28")
        plan.method, plan.count = "tools/call", 1
        op = _submit(server, "sleep_then_complete", "ext-lost", seconds=0.05)
    assert op.state == State.SUBMISSION_UNKNOWN and op.remote_id == ""
    time.sleep(0.5)
    assert ext_peer_stats(ext_url)["runs"]["sleep_then_complete"] - before == 1  # created once


# -- aip-151/v1 ---------------------------------------------------------------------------------


def test_aip_complete_with_progress_in_the_time_series(aip_server: ToolServer) -> None:
    op = _submit(aip_server, "render", "aip-complete", seconds=0.6, value="teal")
    assert op.state == State.WORKING and op.remote_id.startswith("projects/p/locations/l/operations/")
    _settle()
    receipt = _receipt(op)
    assert receipt["terminal_status"] == "completed"
    assert receipt["payload"]["payload"]["value"] == "teal"  # type: ignore[index]
    progress = [e["data"]["progress"]["progressPercent"]
                for e in operation_snapshot(operation_id=op.id)["events"] if "progress" in e["data"]]
    assert progress and progress == sorted(progress)


def test_aip_fail(aip_server: ToolServer) -> None:
    op = _submit(aip_server, "render", "aip-fail", seconds=0.1, outcome="error", errorCode=13)
    _settle()
    receipt = _receipt(op)
    assert receipt["terminal_status"] == "failed"
    assert receipt["payload"]["payload"]["code"] == 13  # type: ignore[index]


def test_aip_done_on_create_is_accepted_at_once(aip_server: ToolServer) -> None:
    op = _submit(aip_server, "render", "aip-instant", instant=True, value="now")
    receipt = _receipt(op)
    assert receipt["terminal_status"] == "completed"


def test_aip_request_id_is_the_submission_key(aip_server: ToolServer, aip_url: str) -> None:
    op = _submit(aip_server, "render", "aip-key", seconds=0.1)
    assert aip_stats(aip_url)["names_by_request_id"][op.submission_key] == op.remote_id


def test_aip_deleted_operation_goes_to_reconciliation(aip_server: ToolServer, aip_url: str) -> None:
    op = _submit(aip_server, "render", "aip-deleted", seconds=2)
    with Aip151Adapter(url=aip_url, options=AIP_OPTIONS) as adapter:
        adapter.delete(remote_id=op.remote_id)
    _settle()
    snap = operation_snapshot(operation_id=op.id)
    assert snap["state"] == State.RECONCILIATION_REQUIRED and snap["receipt"] is None


def test_aip_expiry_goes_to_reconciliation(aip_server: ToolServer) -> None:
    op = _submit(aip_server, "render", "aip-expiry", seconds=0.05, expireAfterSeconds=0.2)
    time.sleep(0.6)
    _settle()
    assert Operation.objects.get(id=op.id).state == State.RECONCILIATION_REQUIRED


def test_aip_lost_answer_resent_with_the_same_request_id(aip_server: ToolServer, aip_url: str) -> None:
    created = aip_stats(aip_url)["counters"].get("created", 0)
    aip_faults(aip_url, dropAfterCommit=1)
    op = _submit(aip_server, "render", "aip-lost", seconds=1.0, value="once")
    assert op.state == State.WORKING
    stats = aip_stats(aip_url)
    assert stats["create_requests"][op.submission_key] == 2
    assert stats["counters"]["created"] - created == 1
    _settle()
    assert _receipt(op)["terminal_status"] == "completed"


def test_aip_answer_lost_on_every_attempt_is_submission_unknown(
    aip_server: ToolServer, aip_url: str
) -> None:
    aip_faults(aip_url, dropAfterCommit=3)
    op = _submit(aip_server, "render", "aip-lost-all", seconds=0.1)
    assert op.state == State.SUBMISSION_UNKNOWN
    assert aip_stats(aip_url)["names_by_request_id"].get(op.submission_key)  # it exists remotely


def test_aip_429_on_poll_reschedules_after_retry_after(aip_server: ToolServer, aip_url: str) -> None:
    op = _submit(aip_server, "render", "aip-429", seconds=0.1)
    aip_faults(aip_url, faults=[{"status": 429, "count": 1, "retryAfter": "2", "match": "get"}])
    time.sleep(0.3)
    run_embedded(until_idle=False, max_seconds=0.6)
    row = Operation.objects.get(id=op.id)
    assert row.state == State.WORKING and row.next_poll_at is not None
    events = operation_snapshot(operation_id=op.id)["events"]
    errors = [e for e in events if e["kind"] == "poll_error"]
    assert errors and errors[0]["data"]["detail"]["retry_after"] == 2.0
    _settle()
    assert _receipt(op)["terminal_status"] == "completed"
