"""What a submit's first transaction reads under SHARE locks before it inserts its row: the
adapter version's status and the tool's rollout rows.

Both are read for the same reason (a drain, a disable or a rollback that commits after the read
must wait for the submit, and one that committed before it is seen: toolops/services/
adapters_admin.py and rollout.py), so on PostgreSQL they are one statement. Lock order: no
transaction holds one of these rows exclusively while it waits for the other (a rollback locks
rollout rows and operations, a disable the adapter's row and then counts operations), so the
order in which this statement takes its two SHARE locks cannot close a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from ledger.models import AdapterState, RolloutConfig, ToolServer
from ledger.statements import statement_spelled
from toolops.services.rollout import rollout_config_locked, rollout_scope_row


@dataclass(frozen=True)
class Admission:
    config: RolloutConfig | None
    # None when not read here (the version has no state row yet, or not PostgreSQL): the insert
    # then reads it itself (adapter_assert_accepting), which also creates the row.
    adapter_status: str | None


def submit_admission_locked(*, server: ToolServer, tool_name: str) -> Admission:
    """The tool's rollout row (rollout_config_locked) and the adapter's status, under SHARE locks
    held to the end of the caller's transaction."""
    if connection.vendor != "postgresql":
        return Admission(config=rollout_config_locked(server=server, tool_name=tool_name),
                         adapter_status=None)
    fields = list(RolloutConfig._meta.concrete_fields)

    def spell() -> str:
        qn = connection.ops.quote_name
        # Table and column names from the models, no user input.
        return (f"SELECT a.{qn('status')}, {', '.join(f'r.{qn(f.column)}' for f in fields)} "
                f"FROM (SELECT {qn('status')} FROM {qn(AdapterState._meta.db_table)} "
                f"WHERE {qn('adapter_version')} = %s FOR SHARE) AS a LEFT JOIN LATERAL "
                f"(SELECT {', '.join(qn(f.column) for f in fields)} "
                f"FROM {qn(RolloutConfig._meta.db_table)} "
                f"WHERE {qn('server_id')} = %s AND {qn('tool_name')} IN (%s, '') "
                f"ORDER BY {qn('tool_name')} FOR SHARE) AS r ON true")

    sql = statement_spelled(site="submit_admission", shape=connection.alias, spell=spell)
    with connection.cursor() as cursor:
        cursor.execute(sql, [server.adapter_version, server.pk, tool_name])
        rows = cursor.fetchall()
    if not rows:
        return Admission(config=rollout_config_locked(server=server, tool_name=tool_name),
                         adapter_status=None)
    attnames = [f.attname for f in fields]
    configs = [RolloutConfig.from_db(connection.alias, attnames, row[1:])
               for row in rows if row[1] is not None]  # the key: NULL when no rollout row
    return Admission(config=rollout_scope_row(configs, tool_name), adapter_status=str(rows[0][0]))
