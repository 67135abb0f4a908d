"""What a submit's first transaction reads before it inserts its row: the server by name, and
under SHARE locks the adapter version's status and the tool's rollout rows.

The last two are read under lock for the same reason (a drain, a disable or a rollback that
commits after the read must wait for the submit, and one that committed before it is seen:
toolops/services/adapters_admin.py and rollout.py); the server is what both are found from. On
PostgreSQL the three are one statement. Lock order: no transaction holds one of these rows
exclusively while it waits for the other (a rollback locks rollout rows and operations, a
disable the adapter's row and then counts operations), so the order in which this statement
takes its two SHARE locks cannot close a cycle. The server's row is not locked, as it was not
when it was read alone: a submit that read it before a disable committed still goes through.

An admission that let a submit in is remembered by the process, with the version (`xmin`) of
each row it was read from. The next submit to the same server and tool decides from it and
inserts on admission_guard's condition, in one statement that takes the same two SHARE locks:
the rows must still be those versions, or nothing is written and the submit reads afresh under
lock (docs/architecture.md, "How the hot statements are spelled").
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from django.db import connection

from ledger.models import AdapterState, RolloutConfig, ToolServer
from ledger.selectors.rows import server_from_row, server_load, server_read_sql
from ledger.statements import statement_spelled
from toolops.services.rollout import rollout_config_locked, rollout_scope_row


@dataclass(frozen=True)
class Fingerprint:
    """Which versions of the rows an admission was decided from (PostgreSQL's `xmin` of each: a
    new one for every write of the row), for the insert's check that they still hold."""

    server: str
    adapter: str
    rollout: str  # the rollout rows' versions, sorted and joined ("" when there are none)


@dataclass(frozen=True)
class Admission:
    server: ToolServer | None  # None: no server of that name
    config: RolloutConfig | None
    # None when not read here (the version has no state row yet, or not PostgreSQL): the insert
    # then reads it itself (adapter_assert_accepting), which also creates the row.
    adapter_status: str | None
    fingerprint: Fingerprint | None = None  # PostgreSQL, with an adapter state row only


def submit_admission_locked(*, server_name: str, tool_name: str) -> Admission:
    """The server by name (as server_load reads it, no lock), the tool's rollout row
    (rollout_config_locked) and the adapter's status, the last two under SHARE locks held to the
    end of the caller's transaction."""
    if connection.vendor != "postgresql":
        server = server_load(name=server_name)
        if server is None:
            return Admission(server=None, config=None, adapter_status=None)
        return Admission(server=server, config=rollout_config_locked(server=server, tool_name=tool_name),
                         adapter_status=None)
    fields = list(RolloutConfig._meta.concrete_fields)
    alias = connection.alias
    server_sql, server_width = server_read_sql(alias=alias)

    def spell() -> str:
        qn = connection.ops.quote_name
        version = qn(ToolServer._meta.get_field("adapter_version").column)
        # Table and column names from the models, no user input. The server read is
        # server_load's own statement, its name parameter first; a server without a state row
        # or rollout rows still comes back (LEFT JOINs, NULL there).
        pk = qn(ToolServer._meta.pk.column)  # type: ignore[union-attr]
        status = qn("status")
        columns = ", ".join(qn(f.column) for f in fields)
        adapter = _adapter_state_locked(f"{status}, xmin::text AS x", f"s.{version}")
        rollout = _rollout_rows_locked(f"{columns}, xmin::text AS x", f"s.{pk}")
        # Last, each row's version (xmin) for the fingerprint.
        return (f"SELECT s.*, a.{status}, {', '.join(f'r.{qn(f.column)}' for f in fields)}, "
                f"v.xmin::text, a.x, r.x "
                f"FROM ({server_sql}) AS s "
                f"JOIN {qn(ToolServer._meta.db_table)} AS v ON v.{pk} = s.{pk} "
                f"LEFT JOIN LATERAL ({adapter}) AS a ON true "
                f"LEFT JOIN LATERAL ({rollout}) AS r ON true")

    sql = statement_spelled(site="submit_admission", shape=alias, spell=spell)
    with connection.cursor() as cursor:
        cursor.execute(sql, [server_name, tool_name])
        rows = cursor.fetchall()
    if not rows:
        return Admission(server=None, config=None, adapter_status=None)
    server = server_from_row(alias=alias, row=rows[0])
    attnames = [f.attname for f in fields]
    key = server_width + 1  # the rollout row's key: NULL when the server has none
    end = key + len(fields)
    configs = [RolloutConfig.from_db(alias, attnames, row[key:end])
               for row in rows if row[key] is not None]
    status = rows[0][server_width]
    server_version, adapter_version = rows[0][end], rows[0][end + 1]
    fingerprint = None if adapter_version is None else Fingerprint(
        server=str(server_version), adapter=str(adapter_version),
        rollout=",".join(sorted(str(row[end + 2]) for row in rows if row[key] is not None)))
    return Admission(server=server, config=rollout_scope_row(configs, tool_name),
                     adapter_status=None if status is None else str(status),
                     fingerprint=fingerprint)


def _adapter_state_locked(columns: str, version: str) -> str:
    """The adapter version's state row under a SHARE lock (`version`: an SQL expression)."""
    qn = connection.ops.quote_name
    return (f"SELECT {columns} FROM {qn(AdapterState._meta.db_table)} "
            f"WHERE {qn('adapter_version')} = {version} FOR SHARE")


def _rollout_rows_locked(columns: str, server: str, tool: str = "%s") -> str:
    """The tool's and the server-wide rollout rows under SHARE locks (`server` and `tool`: SQL
    expressions; by default the tool's name is the statement's next parameter). The admission
    read and the guard both lock through here, so they lock the same rows."""
    qn = connection.ops.quote_name
    return (f"SELECT {columns} FROM {qn(RolloutConfig._meta.db_table)} "
            f"WHERE {qn('server_id')} = {server} AND {qn('tool_name')} IN ({tool}, '') "
            f"ORDER BY {qn('tool_name')} FOR SHARE")


def admission_guard(*, admission: Admission, tool_name: str) -> tuple[str, list[Any]] | None:
    """The condition a submit's insert is made on when it was decided from a remembered
    admission: a query returning a row only while the server's row, the adapter's state row and
    the tool's rollout rows are the versions the admission read. It takes the same SHARE locks
    as the admission read, held by the insert's statement until it commits, so a drain, a
    disable or a rollback is ordered against the insert exactly as against the locked read.
    None for an admission without versions (not read on PostgreSQL, or no state row yet)."""
    fingerprint, server = admission.fingerprint, admission.server
    if fingerprint is None or server is None:
        return None
    qn = connection.ops.quote_name

    def spell() -> str:
        pk = qn(ToolServer._meta.pk.column)  # type: ignore[union-attr]
        # Table and column names from the models; no user input in the text. The values come as
        # one text array (`p.a`): the insert this guards carries some forty values of its own,
        # and psycopg parses a statement of more than 50 parameters again on every execution
        # instead of keeping its parsed form (MAX_CACHED_STATEMENT_PARAMS).
        server = "(p.a[1])::bigint"
        return (f"SELECT 1 FROM (SELECT %s::text[] AS a) AS p "
                f"JOIN {qn(ToolServer._meta.db_table)} AS s ON s.{pk} = {server} "
                f"WHERE s.xmin::text = p.a[2] "
                f"AND ({_adapter_state_locked('xmin::text', 'p.a[3]')}) IS NOT DISTINCT FROM p.a[4] "
                f"AND (SELECT coalesce(string_agg(q.x, ',' ORDER BY q.x), '') "
                f"FROM ({_rollout_rows_locked('xmin::text AS x', server, 'p.a[5]')}) AS q) "
                f"= p.a[6]")

    sql = statement_spelled(site="submit_admission_guard", shape=connection.alias, spell=spell)
    return sql, [[str(server.pk), fingerprint.server, server.adapter_version, fingerprint.adapter,
                  tool_name, fingerprint.rollout]]


# Admissions remembered per process, by (database alias, server name, tool name): a hint only.
# A submit decided from one inserts on admission_guard's condition, so a remembered admission
# that no longer holds costs a refused insert and a fresh read, never a wrong decision.
_remembered: dict[tuple[str, str, str], Admission] = {}
_remembered_lock = threading.Lock()
# Bounded: a process submitting to very many server and tool pairs starts afresh when full.
REMEMBERED_ADMISSIONS_MAX = 1024


def admission_remembered(*, server_name: str, tool_name: str) -> Admission | None:
    with _remembered_lock:
        return _remembered.get((connection.alias, server_name, tool_name))


def admission_remember(*, server_name: str, tool_name: str, admission: Admission) -> None:
    """Keep an admission that let a submit in (read under its locks), for the next submits."""
    if admission.fingerprint is None or admission.server is None:
        return
    with _remembered_lock:
        if len(_remembered) >= REMEMBERED_ADMISSIONS_MAX:
            _remembered.clear()
        _remembered[(connection.alias, server_name, tool_name)] = admission


def admission_forget(*, server_name: str, tool_name: str) -> None:
    with _remembered_lock:
        _remembered.pop((connection.alias, server_name, tool_name), None)


def admissions_forget_all() -> None:
    """Forget every remembered admission (a test's database is flushed; a process that wants
    its next submits to read afresh)."""
    with _remembered_lock:
        _remembered.clear()
