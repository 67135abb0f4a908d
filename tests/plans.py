"""The plans PostgreSQL makes for a statement spelled with `%s` placeholders: the one for given
values, and the generic one a prepared statement may keep for a whole session."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection


def plan_for(sql: str, params: Sequence[object]) -> str:
    """EXPLAIN of the statement with these values (a custom plan)."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}", list(params))
        return "\n".join(row[0] for row in cursor.fetchall())


def plan_generic(sql: str, types: Sequence[str], params: Sequence[object]) -> str:
    """EXPLAIN of the statement prepared with these parameter types, planned without its values."""
    numbered = sql
    for i in range(1, len(types) + 1):
        numbered = numbered.replace("%s", f"${i}", 1)
    with connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE plan_probe ({', '.join(types)}) AS {numbered}")
        try:
            cursor.execute(f"EXPLAIN EXECUTE plan_probe ({', '.join(['%s'] * len(params))})",
                           list(params))
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE plan_probe")
            cursor.execute("RESET plan_cache_mode")
