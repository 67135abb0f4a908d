"""Growing the operation table with committed rows and reading what the planner counts, for the
statistics refresh's tests (tests/ledger/test_statistics.py and its callers' tests)."""

from __future__ import annotations

import time

from django.db import connection

from ledger.models import Operation
from tests.ledger.factories import OperationFactory, ToolServerFactory


def sql_rows(sql: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall() if cursor.description else []


def planned_rows() -> float:
    """The operation table's row count as the planner has it (`reltuples`)."""
    return sql_rows("SELECT reltuples FROM pg_class WHERE relname = 'ledger_operation'")[0][0]


def grow_to(rows: int, **fields: object) -> None:
    """Commit `rows` operation rows and wait until the statistics system counts them."""
    server = ToolServerFactory()
    Operation.objects.bulk_create(OperationFactory.build_batch(rows, server=server, **fields),
                                  batch_size=500)
    sql_rows("SELECT pg_stat_force_next_flush()")  # this session's counts reach the shared statistics
    counted = "SELECT n_live_tup FROM pg_stat_user_tables WHERE relname = 'ledger_operation'"
    deadline = time.monotonic() + 10
    while sql_rows(counted)[0][0] < rows:
        assert time.monotonic() < deadline, "the statistics system never counted the new rows"
        time.sleep(0.1)
