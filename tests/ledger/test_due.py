"""The due table (ledger.models.due) against the operation rows it is derived from, on
PostgreSQL: the triggers keep exactly one entry per scheduled row, due at the later of its next
poll time and its lease's end, through inserts, every kind of update and deletes."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.models import Operation, OperationDue
from ledger.models.operations import SCHEDULED_STATES
from ledger.states import State
from tests.ledger.factories import OperationFactory, ToolServerFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _expected() -> dict[object, tuple[datetime, int, str]]:
    """The due table as it must be, computed from the operation rows in Python."""
    return {
        op.id: (max(t for t in (op.next_poll_at, op.lease_expires_at) if t is not None),
                op.server_id, op.executor_path)
        for op in Operation.objects.all() if op.state in SCHEDULED_STATES
    }


def _actual() -> dict[object, tuple[datetime, int, str]]:
    return {d.operation_id: (d.due_at, d.server_id, d.executor_path)
            for d in OperationDue.objects.all()}


@pytest.mark.parametrize("state", list(State))
def test_an_inserted_row_has_an_entry_exactly_when_its_state_is_scheduled(state: State) -> None:
    now = timezone.now()
    op = OperationFactory(state=state, next_poll_at=now, lease_expires_at=now + timedelta(seconds=30),
                          lease_owner="w")
    entry = OperationDue.objects.filter(operation_id=op.id).first()
    if state in SCHEDULED_STATES:
        assert entry is not None and entry.due_at == now + timedelta(seconds=30)
    else:
        assert entry is None


def test_leaving_and_reentering_a_scheduled_state_removes_and_restores_the_entry() -> None:
    now = timezone.now()
    op = OperationFactory(state=State.WORKING, next_poll_at=now)
    Operation.objects.filter(id=op.id).update(state=State.INPUT_REQUIRED, next_poll_at=None)
    assert not OperationDue.objects.filter(operation_id=op.id).exists()
    later = now + timedelta(seconds=9)
    Operation.objects.filter(id=op.id).update(state=State.WORKING, next_poll_at=later)
    assert OperationDue.objects.get(operation_id=op.id).due_at == later
    Operation.objects.filter(id=op.id).update(state=State.ACCEPTED, next_poll_at=None)
    assert not OperationDue.objects.filter(operation_id=op.id).exists()


def test_an_update_of_other_columns_leaves_the_entry_alone() -> None:
    op = OperationFactory(state=State.WORKING)
    before = OperationDue.objects.get(operation_id=op.id).due_at
    Operation.objects.filter(id=op.id).update(server_status_message="halfway", poll_attempts=3)
    assert OperationDue.objects.get(operation_id=op.id).due_at == before


def test_deleting_an_operation_deletes_its_entry() -> None:
    op = OperationFactory(state=State.WORKING)
    op.delete()
    assert not OperationDue.objects.exists()


_STATES = st.sampled_from([State.SUBMITTING, State.WORKING, State.CANCEL_REQUESTED,
                           State.INPUT_REQUIRED, State.RECONCILIATION_REQUIRED, State.ACCEPTED])
_OFFSET = st.one_of(st.none(), st.integers(min_value=-600, max_value=600))
_STEP = st.tuples(st.integers(min_value=0, max_value=4), _STATES, _OFFSET, _OFFSET,
                  st.booleans())


@given(steps=st.lists(_STEP, min_size=1, max_size=25))
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_any_sequence_of_writes_keeps_the_due_table_equal_to_the_rows(steps: list) -> None:
    # Writes of every shape a service makes (state, next poll time, lease, executor path, all at
    # once or one at a time, in one transaction or several), checked against the rows after
    # each commit. A write the CHECK constraint refuses (a scheduled row with neither time) must
    # leave both tables as they were.
    Operation.objects.all().delete()
    servers = [ToolServerFactory(), ToolServerFactory()]
    now = timezone.now()
    rows = [OperationFactory(server=servers[k % 2], next_poll_at=now) for k in range(5)]
    for index, state, next_offset, lease_offset, move in steps:
        fields: dict[str, object] = {
            "state": state,
            "next_poll_at": None if next_offset is None else now + timedelta(seconds=next_offset),
            "lease_expires_at": None if lease_offset is None else now + timedelta(seconds=lease_offset),
        }
        if move:
            fields["executor_path"] = "legacy" if index % 2 else "tasks"
            fields["server"] = servers[(index + 1) % 2]
        try:
            with transaction.atomic():
                Operation.objects.filter(id=rows[index].id).update(**fields)
        except Exception as exc:  # the CHECK op_open_row_scheduled, nothing else
            assert "op_open_row_scheduled" in str(exc), exc
        assert _actual() == _expected()


@pytest.mark.django_db(transaction=False)
def test_the_embedded_default_sqlite_database_gets_the_triggers(tmp_path) -> None:
    # The README's first command runs on SQLite: the same migration installs the SQLite
    # triggers, and they keep the entry as on PostgreSQL (a fresh database, migrated by
    # manage.py in its own process as a user would).
    import os
    import sqlite3
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    db = tmp_path / "embedded.sqlite3"
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{db}", "DJANGO_SETTINGS_MODULE": "config.settings"}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=root, env=env, check=True,
                   timeout=240)
    with sqlite3.connect(db) as con:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        assert {"ledger_operation_due_on_insert", "ledger_operation_due_on_update"} <= names
    # Rows written through the ORM on that database, in a process of its own.
    script = (
        "from datetime import timedelta\n"
        "from django.utils import timezone\n"
        "from ledger.models import Operation, OperationDue, ToolServer\n"
        "s = ToolServer.objects.create(name='s', url='http://127.0.0.1:1/mcp',"
        " adapter_version='mcp-tasks/2025-11-25')\n"
        "now = timezone.now()\n"
        "op = Operation.objects.create(server=s, call_node_id='n', tool_name='t',"
        " descriptor_version='d', request_digest='r', body={}, adapter_version='a',"
        " submission_key='k', state='WORKING', next_poll_at=now)\n"
        "print(OperationDue.objects.get(operation=op).due_at == now)\n"
        "Operation.objects.filter(id=op.id).update(lease_expires_at=now + timedelta(seconds=5))\n"
        "print(OperationDue.objects.get(operation=op).due_at == now + timedelta(seconds=5))\n"
        "Operation.objects.filter(id=op.id).update(lease_expires_at=None,"
        " next_poll_at=now - timedelta(seconds=5))\n"
        "print(OperationDue.objects.get(operation=op).due_at == now - timedelta(seconds=5))\n"
        "Operation.objects.filter(id=op.id).update(state='INPUT_REQUIRED', next_poll_at=None)\n"
        "print(not OperationDue.objects.exists())\n"
    )
    out = subprocess.run([sys.executable, "manage.py", "shell", "-v0", "-c", script], cwd=root, env=env,
                         check=True, timeout=240, capture_output=True, text=True).stdout
    assert out.split() == ["True"] * 4, out


def test_the_migration_gives_each_open_row_of_an_installed_ledger_its_entry() -> None:
    # An installed ledger upgraded: rows written before the due table existed get their entry
    # from the migration's backfill (a row nobody schedules any more must not be stranded).
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before = [("ledger", "0015_event_operation_index_dropped")]
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(before)
    apps = executor.loader.project_state(before).apps
    server = apps.get_model("ledger", "ToolServer").objects.create(
        name="old", url="http://127.0.0.1:1/mcp", adapter_version="mcp-tasks/2025-11-25")
    historical = apps.get_model("ledger", "Operation")
    now = timezone.now()

    def row(key: str, **fields: object) -> object:
        return historical.objects.create(
            server=server, call_node_id=key, tool_name="t", descriptor_version="d",
            request_digest="r", body={}, adapter_version="mcp-tasks/2025-11-25",
            submission_key=key, **fields).id

    working = row("w", state="WORKING", next_poll_at=now)
    leased = row("l", state="CANCEL_REQUESTED", next_poll_at=now,
                 lease_expires_at=now + timedelta(seconds=30), lease_owner="x")
    row("a", state="ACCEPTED")
    row("i", state="INPUT_REQUIRED")
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert dict(OperationDue.objects.values_list("operation_id", "due_at")) == {
        working: now, leased: now + timedelta(seconds=30)}
    assert _actual() == _expected()


def test_a_sqlite_table_rebuilt_by_a_migration_keeps_the_triggers_both_ways(tmp_path: Path) -> None:
    # SQLite rebuilds a table to change a column's CHECK constraint, which drops its triggers:
    # 0019_counters_one_check_per_table puts them back after its rebuild, applied or unapplied.
    root = Path(__file__).resolve().parents[2]
    db = tmp_path / "rebuilt.sqlite3"
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{db}", "DJANGO_SETTINGS_MODULE": "config.settings"}
    wanted = {"ledger_operation_due_on_insert", "ledger_operation_due_on_update"}
    for target in ([], ["ledger", "0018"], []):
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0", *target], cwd=root, env=env,
                       check=True, timeout=240)
        with sqlite3.connect(db) as con:
            names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        assert wanted <= names, target
