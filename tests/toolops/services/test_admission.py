"""The submit's admission read: the server by name, and the adapter's status and the rollout rows
under SHARE locks, in one statement (real transactions and row locks on PostgreSQL)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from ledger.models import AdapterState, RolloutConfig, ToolServer
from ledger.selectors.rows import server_load
from tests.concurrency import release_once_a_lock_is_awaited
from tests.ledger.factories import ToolServerFactory
from toolops.errors import SubmitRefused
from toolops.services.adapters_admin import adapter_status_check
from toolops.services.admission import Admission, submit_admission_locked

pytestmark = pytest.mark.django_db(transaction=True)


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
