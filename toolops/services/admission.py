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
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from ledger.models import AdapterState, RolloutConfig, ToolServer
from ledger.selectors.rows import server_from_row, server_load, server_read_sql
from ledger.statements import statement_spelled
from toolops.services.rollout import rollout_config_locked, rollout_scope_row


@dataclass(frozen=True)
class Admission:
    server: ToolServer | None  # None: no server of that name
    config: RolloutConfig | None
    # None when not read here (the version has no state row yet, or not PostgreSQL): the insert
    # then reads it itself (adapter_assert_accepting), which also creates the row.
    adapter_status: str | None


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
        return (f"SELECT s.*, a.{qn('status')}, {', '.join(f'r.{qn(f.column)}' for f in fields)} "
                f"FROM ({server_sql}) AS s "
                f"LEFT JOIN LATERAL (SELECT {qn('status')} FROM {qn(AdapterState._meta.db_table)} "
                f"WHERE {qn('adapter_version')} = s.{version} FOR SHARE) AS a ON true "
                f"LEFT JOIN LATERAL (SELECT {', '.join(qn(f.column) for f in fields)} "
                f"FROM {qn(RolloutConfig._meta.db_table)} "
                f"WHERE {qn('server_id')} = s.{qn(ToolServer._meta.pk.column)} "  # type: ignore[union-attr]
                f"AND {qn('tool_name')} IN (%s, '') "
                f"ORDER BY {qn('tool_name')} FOR SHARE) AS r ON true")

    sql = statement_spelled(site="submit_admission", shape=alias, spell=spell)
    with connection.cursor() as cursor:
        cursor.execute(sql, [server_name, tool_name])
        rows = cursor.fetchall()
    if not rows:
        return Admission(server=None, config=None, adapter_status=None)
    server = server_from_row(alias=alias, row=rows[0])
    attnames = [f.attname for f in fields]
    key = server_width + 1  # the rollout row's key: NULL when the server has none
    configs = [RolloutConfig.from_db(alias, attnames, row[key:]) for row in rows if row[key] is not None]
    status = rows[0][server_width]
    return Admission(server=server, config=rollout_scope_row(configs, tool_name),
                     adapter_status=None if status is None else str(status))
