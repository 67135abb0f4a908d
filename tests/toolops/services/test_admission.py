"""The submit's admission read: the server by name, and the adapter's status and the rollout rows
under SHARE locks, in one statement (real transactions and row locks on PostgreSQL)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from ledger.models import AdapterState, Operation, OperationEvent, RolloutConfig, ToolServer
from ledger.selectors.rows import server_load
from ledger.states import State
from tests.concurrency import release_once_a_lock_is_awaited, submit_racing_a_rollback
from tests.ledger.factories import ToolServerFactory
from tests.peers.launch import peer_stats
from tests.toolops.helpers import submit_sleep, submit_tool_call
from toolops.errors import SubmissionKeyTaken, SubmitRefused
from toolops.services.adapters_admin import adapter_set_status, adapter_status_check
from toolops.services.admission import Admission, submit_admission_locked
from toolops.services.rollout import rollout_configure, rollout_move
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server_options() -> dict[str, Any]:
    return {"sync_bounds": {"read_value": 10.0}}


def test_the_server_the_status_and_the_tools_rollout_row_are_one_statement() -> None:
    server = ToolServerFactory(credentials={"headers": {"Authorization": "Bearer t"}}, server_info={"k": [1]})
    AdapterState.objects.create(adapter_version=server.adapter_version)
    RolloutConfig.objects.create(server=server, tool_name="", canary_bp=10)
    tool_row = RolloutConfig.objects.create(server=server, tool_name="render", canary_bp=50)
    RolloutConfig.objects.create(server=server, tool_name="other", canary_bp=90)
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        admission = submit_admission_locked(server_name=server.name, tool_name="render")
    reads = [q["sql"] for q in captured.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(reads) == 1 and "ledger_adapterstate" in reads[0] and "ledger_rolloutconfig" in reads[0]
    # The server as server_load builds it: every field, JSON columns decoded.
    loaded = server_load(name=server.name)
    assert admission.server is not None and loaded is not None
    assert {f.attname: getattr(admission.server, f.attname) for f in ToolServer._meta.concrete_fields} \
        == {f.attname: getattr(loaded, f.attname) for f in ToolServer._meta.concrete_fields}
    assert admission.server.credentials == {"headers": {"Authorization": "Bearer t"}}
    assert admission.adapter_status == "enabled"
    assert admission.config is not None and admission.config.pk == tool_row.pk
    assert admission.config.canary_bp == 50 and admission.config.server_id == server.pk
    with transaction.atomic():
        # No row of the tool's own: the server's row; no row at all: none.
        assert submit_admission_locked(server_name=server.name,
                                       tool_name="x").config.tool_name == ""  # type: ignore[union-attr]
        bare = ToolServerFactory()
        admission = submit_admission_locked(server_name=bare.name, tool_name="x")
        assert admission.config is None and admission.server is not None and admission.server.pk == bare.pk
        assert submit_admission_locked(server_name="nobody", tool_name="x") == (
            Admission(server=None, config=None, adapter_status=None))


def test_a_version_without_its_state_row_leaves_the_status_to_the_insert() -> None:
    server = ToolServerFactory()
    row = RolloutConfig.objects.create(server=server, tool_name="", canary_bp=10)
    with transaction.atomic():
        admission = submit_admission_locked(server_name=server.name, tool_name="render")
    assert admission.adapter_status is None and admission.server is not None
    assert admission.config is not None and admission.config.pk == row.pk


def test_a_disable_holding_the_lock_is_waited_for_and_its_status_read() -> None:
    server = ToolServerFactory()
    AdapterState.objects.create(adapter_version=server.adapter_version)
    locked, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def disabler() -> None:
        try:
            with transaction.atomic():
                state = AdapterState.objects.select_for_update().get(
                    adapter_version=server.adapter_version)
                locked.set()
                release.wait(10)
                state.status = AdapterState.Status.DRAINING
                state.save()
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)
            locked.set()
        finally:
            connection.close()

    holder = threading.Thread(target=disabler)
    holder.start()
    assert locked.wait(10)
    watcher = threading.Thread(target=release_once_a_lock_is_awaited, args=(release,))
    watcher.start()
    try:
        with transaction.atomic():
            admission = submit_admission_locked(server_name=server.name, tool_name="render")
    finally:
        release.set()
        watcher.join(10)
        holder.join(10)
    assert not errors
    # The read waited for the drain to commit and saw it: the insert would be refused.
    assert admission.adapter_status == "draining"
    with pytest.raises(SubmitRefused, match="is draining"):
        adapter_status_check(version=server.adapter_version, status=admission.adapter_status)


# -- remembered admissions: the next submit's first commit as one statement -----------------


def _first_commit_statements(server: ToolServer, node: str) -> tuple[Operation, list[str]]:
    """Submit and return the row with the statements sent before the request left (the reply's
    UPDATE is the last statement, after the send)."""
    with CaptureQueriesContext(connection) as captured:
        op = submit_sleep(server, node=node, seconds=0.2)
    return op, [q["sql"] for q in captured.captured_queries][:-1]


def test_a_remembered_admission_makes_the_next_submits_first_commit_one_statement(
        server: ToolServer) -> None:
    first, before_send = _first_commit_statements(server, "adm-1")
    assert before_send[0] == "BEGIN" and before_send[-1] == "COMMIT" and len(before_send) == 4
    second, before_send = _first_commit_statements(server, "adm-2")
    # One statement: the SHARE locks, the check that the rows are the versions read, the row
    # and its created event; no BEGIN and no COMMIT round trip (autocommit).
    assert len(before_send) == 1 and "xmin" in before_send[0] and "FOR SHARE" in before_send[0]
    for op in (first, second):
        assert op.state == State.WORKING and op.remote_id
        assert OperationEvent.objects.filter(operation_id=op.id, kind="created").count() == 1


def test_the_submits_insert_stays_within_what_psycopg_keeps_parsed(server: ToolServer) -> None:
    """Both spellings of the first commit's insert (the locked path's and the remembered
    admission's) within psycopg's statement cache limits: above 50 parameters or 4096 bytes it
    parses the text again on every execution. The created event copies the row it was inserted
    with."""
    from psycopg import _queries

    from ledger.statements import _SPELLED

    for node in ("cache-1", "cache-2"):
        submit_sleep(server, node=node, seconds=0.2)
    spelled = [(shape, text) for (site, shape), text in _SPELLED.items()
               if site == "operation_insert_with_first_event"]
    assert {shape[-1] is None for shape, _ in spelled} == {True, False}  # both paths ran
    for _shape, text in spelled:
        assert text.count("%s") <= _queries.MAX_CACHED_STATEMENT_PARAMS
        assert len(text.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH
    for op in Operation.objects.filter(call_node_id__in=["cache-1", "cache-2"]):
        created = OperationEvent.objects.get(operation=op, kind="created")
        assert (created.seq, created.from_state, created.to_state) == (1, "", State.SUBMITTING)
        assert created.created_at == op.created_at
        assert (created.execution_epoch, created.cancel_generation) == (op.execution_epoch, 0)


@pytest.mark.parametrize("change", ["server_disabled", "tool_gone", "adapter_draining",
                                    "tasks_rolled_back"])
def test_an_admission_that_no_longer_holds_is_read_again_and_decides(
        server: ToolServer, change: str) -> None:
    submit_sleep(server, node="adm-warm")  # remembered from here on
    if change == "server_disabled":
        ToolServer.objects.filter(pk=server.pk).update(status=ToolServer.Status.DISABLED)
    elif change == "tool_gone":
        tools = dict(server.tools)
        tools.pop("sleep_then_complete")
        ToolServer.objects.filter(pk=server.pk).update(tools=tools)
    elif change == "adapter_draining":
        adapter_set_status(version=server.adapter_version, status=AdapterState.Status.DRAINING)
    else:
        rollout_move(server_name=server.name, tool_name="", to_path="legacy", actor="t",
                     reason="test")
    with pytest.raises(SubmitRefused):
        submit_sleep(server, node="adm-after")
    # Refused from a fresh read: no row, nothing written by the remembered admission's insert.
    assert not Operation.objects.filter(call_node_id="adm-after").exists()


def test_a_changed_rollout_row_sends_the_next_submit_down_the_path_it_now_says(
        server: ToolServer) -> None:
    rollout_configure(server_name=server.name, tool_name="read_value", canary_percent=0.0,
                      actor="t", reason="none")
    submit_tool_call(server, "read_value", "adm-read-warm", seconds=0, value="v")
    assert submit_tool_call(server, "read_value", "adm-read-1", seconds=0,
                            value="v").executor_path == "legacy"
    rollout_configure(server_name=server.name, tool_name="read_value", canary_percent=100.0,
                      actor="t", reason="all")
    assert submit_tool_call(server, "read_value", "adm-read-2", seconds=0,
                            value="v").executor_path == "tasks"


def test_a_rollback_holding_the_lock_is_waited_for_by_a_remembered_admission(
        server: ToolServer, mcp_url: str) -> None:
    """The insert made on a remembered admission takes the rollout rows' SHARE locks in its own
    statement: a rollback holding them is waited for, and once it commits the rows are new
    versions, so the submit reads afresh and is refused, and nothing reaches the server."""
    rollout_configure(server_name=server.name, canary_percent=100.0, actor="t", reason="all")
    submit_sleep(server, node="adm-race-warm")
    before = peer_stats(mcp_url)["tasks_created"]
    result = submit_racing_a_rollback(lambda: submit_sleep(server.name, node="adm-race-1"))
    assert len(result) == 1 and isinstance(result[0], SubmitRefused), result
    assert not Operation.objects.filter(call_node_id="adm-race-1").exists()
    assert peer_stats(mcp_url)["tasks_created"] == before


def test_a_remembered_admission_inserts_once_under_concurrent_submits(server: ToolServer) -> None:
    """Several threads submit on the same remembered admission, each with its own key: each
    row is inserted once, and two submits of one key give one row and a replay."""
    submit_sleep(server, node="adm-many-warm")
    errors: list[BaseException] = []
    taken: list[str] = []

    def submit(i: int) -> None:
        try:
            operation_submit(server_name=server.name, tool_name="sleep_then_complete",
                             call_node_id=f"adm-many-{i % 4}", submission_key=f"adm-key-{i % 4}",
                             arguments={"seconds": 0.2, "value": "v"}, ttl_ms=60_000)
        except SubmissionKeyTaken:
            taken.append(str(i))
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(taken) == 4
    assert Operation.objects.filter(call_node_id__startswith="adm-many-").exclude(
        call_node_id="adm-many-warm").count() == 4
