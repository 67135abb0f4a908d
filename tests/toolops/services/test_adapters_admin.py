"""Adapter versions: enabled / draining / disabled, and `server-add --adapter auto`.

Draining refuses new submissions while rows in flight reach their receipts; disabling is
refused while rows are open, including a row whose submit transaction is still running
(real threads and PostgreSQL row locks).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection, transaction

from ledger.models import AdapterState, Operation, ToolServer
from ledger.states import State
from tests.ledger.factories import OperationFactory, ToolServerFactory
from tests.peers.launch_aip import AIP_OPTIONS, aip_reset
from tests.peers.launch_ext import running_ext_server
from toolops.errors import SubmitRefused, ToolopsError
from toolops.runner import run_embedded
from toolops.services.adapters_admin import (
    AdapterBusy,
    adapter_assert_accepting,
    adapter_list,
    adapter_set_status,
)
from toolops.services.servers import server_add
from toolops.services.submit import operation_submit

REPO = Path(__file__).resolve().parents[3]
EXT = "mcp-tasks-ext/2026-07-28"
AIP = "aip-151/v1"


def _listing() -> dict[str, dict[str, object]]:
    return {row["adapter_version"]: row for row in adapter_list()}


@pytest.mark.django_db
def test_every_known_version_is_listed_enabled_by_default() -> None:
    listing = _listing()
    assert set(listing) == {"mcp-tasks/2025-11-25", EXT, AIP}
    assert {row["status"] for row in listing.values()} == {"enabled"}


@pytest.mark.django_db
def test_unknown_version_and_status_are_refused() -> None:
    with pytest.raises(ToolopsError, match="unknown adapter version"):
        adapter_set_status(version="azure-lro/v1", status="draining")
    with pytest.raises(ToolopsError, match="unknown adapter status"):
        adapter_set_status(version=EXT, status="paused")


def _drain_with_rows_in_flight(server: ToolServer, version: str, tool: str,
                               args: dict[str, object]) -> None:
    in_flight = [operation_submit(server_name=server.name, tool_name=tool, call_node_id=f"{version}-{i}",
                                  arguments=args) for i in range(2)]
    assert all(op.state == State.WORKING for op in in_flight)
    adapter_set_status(version=version, status="draining", reason="moving to v2")

    rows_before = Operation.objects.count()
    with pytest.raises(SubmitRefused, match=f"adapter {version} is draining: it takes no new submissions"):
        operation_submit(server_name=server.name, tool_name=tool, call_node_id="after-drain", arguments=args)
    assert Operation.objects.count() == rows_before  # nothing written, nothing sent
    assert _listing()[version]["open_operations"] == 2

    with pytest.raises(AdapterBusy, match="2 operation"):
        adapter_set_status(version=version, status="disabled")
    assert AdapterState.objects.get(adapter_version=version).status == "draining"

    run_embedded(until_idle=True, max_seconds=30)  # in-flight rows go on to their receipts
    for op in in_flight:
        op.refresh_from_db()
        assert op.state == State.ACCEPTED and op.terminal_status == "completed"
    assert _listing()[version]["open_operations"] == 0

    adapter_set_status(version=version, status="disabled")
    with pytest.raises(SubmitRefused, match="is disabled"):
        operation_submit(server_name=server.name, tool_name=tool, call_node_id="after-disable",
                         arguments=args)
    adapter_set_status(version=version, status="enabled")
    again = operation_submit(server_name=server.name, tool_name=tool, call_node_id="re-enabled",
                             arguments=args)
    assert again.state in (State.WORKING, State.ACCEPTED)


@pytest.mark.django_db
def test_draining_ext_adapter_with_rows_in_flight(ext_url: str) -> None:
    server = server_add(name="ext", url=ext_url, adapter_version=EXT)
    _drain_with_rows_in_flight(server, EXT, "sleep_then_complete", {"seconds": 0.8})


@pytest.mark.django_db
def test_draining_aip_adapter_with_rows_in_flight(aip_url: str) -> None:
    aip_reset(aip_url)
    server = server_add(name="aip", url=aip_url, adapter_version=AIP, options=AIP_OPTIONS)
    _drain_with_rows_in_flight(server, AIP, "render", {"seconds": 0.8})


@pytest.mark.django_db
def test_draining_one_version_leaves_the_others_accepting(aip_url: str, ext_url: str) -> None:
    aip_reset(aip_url)
    server_add(name="aip", url=aip_url, adapter_version=AIP, options=AIP_OPTIONS)
    adapter_set_status(version=EXT, status="draining")
    op = operation_submit(server_name="aip", tool_name="render", call_node_id="n", arguments={"seconds": 0.1})
    assert op.adapter_version == AIP and op.state == State.WORKING


def _in_thread(fn: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


@pytest.mark.django_db(transaction=True)
def test_disable_waits_for_a_running_submit_and_then_sees_its_row() -> None:
    server = ToolServerFactory(adapter_version=EXT)
    AdapterState.objects.create(adapter_version=EXT)
    inserted, release = threading.Event(), threading.Event()

    def submit_transaction() -> None:
        # What operation_submit's row transaction does: the SHARE lock, then the insert.
        with transaction.atomic():
            adapter_assert_accepting(version=EXT)
            OperationFactory(server=server, adapter_version=EXT, state=State.SUBMITTING)
            inserted.set()
            release.wait(10)

    submitter, submit_errors = _in_thread(submit_transaction)
    assert inserted.wait(10)
    disabler, disable_errors = _in_thread(lambda: adapter_set_status(version=EXT, status="disabled") and None)
    time.sleep(0.5)
    assert disabler.is_alive()  # blocked on the row lock the submit holds
    release.set()
    submitter.join(10)
    disabler.join(10)
    assert not submit_errors
    assert len(disable_errors) == 1 and isinstance(disable_errors[0], AdapterBusy)
    assert AdapterState.objects.get(adapter_version=EXT).status == "enabled"


# -- the CLI and --adapter auto (real subprocesses on the embedded SQLite default) ------------


def test_cli_adapter_list_drain_disable_enable(cli, ext_url: str) -> None:  # type: ignore[no-untyped-def]
    listing = json.loads(cli("toolops", "adapter", "--list").stdout)
    assert {r["adapter_version"]: r["status"] for r in listing}[EXT] == "enabled"
    cli("toolops", "server-add", "ext", "--url", ext_url, "--adapter", "auto")
    sub = json.loads(cli("toolops", "submit", "--server", "ext", "--tool", "sleep_then_complete",
                         "--call-node", "c1", "--args", '{"seconds": 0.5}').stdout)
    assert sub["state"] == "WORKING"
    assert json.loads(cli("toolops", "adapter", "--drain", EXT).stdout)["status"] == "draining"
    refused = cli("toolops", "submit", "--server", "ext", "--tool", "sleep_then_complete",
                  "--call-node", "c2", check=False)
    assert refused.returncode != 0 and f"adapter {EXT} is draining" in refused.stderr
    busy = cli("toolops", "adapter", "--disable", EXT, check=False)
    assert busy.returncode != 0 and "still open" in busy.stderr
    cli("toolops", "run", "--until-idle", "--max-seconds", "30")
    assert json.loads(cli("toolops", "adapter", "--disable", EXT).stdout)["status"] == "disabled"
    listing = {r["adapter_version"]: r for r in json.loads(cli("toolops", "adapter", "--list").stdout)}
    assert listing[EXT]["status"] == "disabled" and listing[EXT]["open_operations"] == 0
    assert json.loads(cli("toolops", "adapter", "--enable", EXT).stdout)["status"] == "enabled"


def test_cli_server_add_auto_picks_each_shape(cli, ext_url: str, mcp_url: str) -> None:  # type: ignore[no-untyped-def]
    ext = json.loads(cli("toolops", "server-add", "ext", "--url", ext_url, "--adapter", "auto").stdout)
    assert ext["adapter"] == EXT and ext["protocol_version"] == "2026-07-28"
    core = json.loads(cli("toolops", "server-add", "core", "--url", mcp_url, "--adapter", "auto").stdout)
    assert core["adapter"] == "mcp-tasks/2025-11-25" and core["protocol_version"] == "2025-11-25"


def test_cli_server_add_auto_sync_only_within_bound_else_refuse(cli) -> None:  # type: ignore[no-untyped-def]
    with running_ext_server(tasks=False) as url:
        refused = cli("toolops", "server-add", "plain", "--url", url, "--adapter", "auto", check=False)
        assert refused.returncode != 0 and "offers no task support" in refused.stderr
        added = json.loads(cli("toolops", "server-add", "plain", "--url", url, "--adapter", "auto",
                               "--sync-bounds", '{"quick_sync": 5}').stdout)
        assert added["adapter"] == EXT  # newest shape that answered, synchronous only
        sub = json.loads(cli("toolops", "submit", "--server", "plain", "--tool", "quick_sync",
                             "--call-node", "s1", "--args", '{"value": "v"}').stdout)
        assert sub["state"] == "ACCEPTED" and sub["remote_id"] == ""


def test_cli_server_add_auto_refuses_a_non_mcp_endpoint(cli, aip_url: str) -> None:  # type: ignore[no-untyped-def]
    # An AIP-151 service is never taken for MCP, even with bounds published.
    refused = cli("toolops", "server-add", "lro", "--url", aip_url, "--adapter", "auto",
                  "--sync-bounds", '{"render": 5}', check=False)
    assert refused.returncode != 0 and "refusing" in refused.stderr


def test_cli_server_add_aip_with_configured_methods(cli, aip_url: str) -> None:  # type: ignore[no-untyped-def]
    added = json.loads(cli("toolops", "server-add", "lro", "--url", aip_url, "--adapter", AIP,
                           "--adapter-options", json.dumps(AIP_OPTIONS)).stdout)
    assert added["adapter"] == AIP and added["tools"] == ["render"]
    sub = json.loads(cli("toolops", "submit", "--server", "lro", "--tool", "render", "--call-node", "a1",
                         "--args", '{"instant": true, "value": "v"}').stdout)
    assert sub["state"] == "ACCEPTED" and sub["remote_id"].startswith("projects/p/locations/l/operations/")
