"""Commits that need not wait for their WAL flush: bookkeeping that is safe to lose in a crash.

By default every PostgreSQL commit waits until its WAL record is on disk (`synchronous_commit`).
A handful of the ledger's writes record nothing that anything outside the database has been told
or will act on: a poll answer that changed nothing but the schedule and counters, a held row's
lease renewal, a dispatcher's claim. If the database crashes within the WAL writer's window (up
to three times `wal_writer_delay`, 0.6 s by default), such a commit is lost as if it had rolled
back: the row is polled again, its lease is shorter, the claim is made again. Nothing that was
accepted, sent or promised is lost, because:

- every write that precedes an effect outside the database (the submission row before its send,
  a cancel before its request, an input answer before it goes out) and every write that others
  act on (the terminal receipt and its outbox row) still waits for its flush;
- the WAL is one sequence, so such a commit also flushes every earlier record, the unflushed
  bookkeeping included: a durable write never outlives a write it depended on.

On this project's benchmark machine a flush costs about 80 microseconds of fsync, and waiting for
it costs the waiting backend and client two context switches; the writes marked here are about a
quarter of a call's commits. The caller decides (toolops passes `TOOLOPS_DEFERRED_FLUSH`; off,
every commit waits again, for an operator who wants counters exact across crashes).

The setting is transaction-local (`set_config(..., true)`), so it never leaks into the session's
next transaction, and it is applied only where the marked write is a transaction by itself or
opens its own: inside a caller's `atomic()` block it would also cover the caller's writes.
"""

from __future__ import annotations

from typing import Any

from django.db import connections

_OFF = "set_config('synchronous_commit', 'off', true)"


def flush_deferrable(*, connection: Any) -> bool:
    """Whether a write on `connection` may commit without waiting for its flush: PostgreSQL, and
    the write a transaction of its own (autocommit, outside any atomic block)."""
    return (connection.vendor == "postgresql" and connection.get_autocommit()
            and not connection.in_atomic_block)


def flush_deferred_condition() -> str:
    """A WHERE condition (`AND ...`) that lets the statement's own implicit transaction commit
    without waiting for its flush, for a statement on a connection where flush_deferrable holds.
    One statement, no extra round trip: the condition is an uncorrelated subquery, which
    PostgreSQL runs once before the first row, and it is always true."""
    return f" AND (SELECT {_OFF}) IS NOT NULL"


def transaction_flush_deferred(*, using: str) -> bool:
    """In an `atomic()` block that holds only deferrable bookkeeping: let its commit skip the
    wait for the flush. The caller must own the transaction (flush_deferrable held just before it
    opened the block), since the setting covers the whole transaction. Returns whether it was
    applied."""
    connection = connections[using]
    if connection.vendor != "postgresql" or not connection.in_atomic_block:
        return False
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {_OFF}")
    return True


__all__ = ["flush_deferrable", "flush_deferred_condition", "transaction_flush_deferred"]
