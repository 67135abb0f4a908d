"""PostgreSQL `timestamptz` values read by psycopg's C parser instead of Django's Python one.

Django's psycopg 3 backend registers its own loader for `timestamptz` on every connection: a
subclass of psycopg's pure-Python loader, which matches each value against a regular expression
in Python and then sets the connection's time zone on the result. An operation row holds about
ten timestamps, and every poll reads its row and every guarded write reads some back: about
3.6 µs a value that way, 0.3 µs through psycopg's C loader (measured on this project's machines;
`tests/ledger/test_pg_loaders.py` holds the two to the same values).

The C loader turns each value into an aware datetime in the session's `TimeZone`, which Django
sets to UTC on every connection when `USE_TZ` is on and the database's `TIME_ZONE` is unset (the
project's settings). In exactly that case, and only with psycopg's C implementation installed
(`psycopg[binary]`), the connection reads `timestamptz` through the C loader. Anything else (a
database `TIME_ZONE`, `USE_TZ = False`, the pure-Python psycopg, another backend) keeps Django's
loader. The wrapper keeps Django's `timezone` attribute, which Django compares on every new cursor
to decide whether to register its own loader again.
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

_C_LOADER: Any = None
try:  # psycopg's C implementation (psycopg[binary] or psycopg[c]); absent in pure Python
    from psycopg import _cmodule

    _C_LOADER = getattr(_cmodule._psycopg, "TimestamptzLoader", None)
except (ImportError, AttributeError):  # pragma: no cover - depends on the installed psycopg
    _C_LOADER = None

_LOADER_CLASS: Any = None
if _C_LOADER is not None:
    from psycopg.adapt import Loader

    class UtcTimestamptzLoader(Loader):
        """`timestamptz` (text) through psycopg's C parser, for sessions in UTC. The C class
        cannot be subclassed; its bound `load` is set on each instance, so a row's values go to
        C with one attribute lookup each."""

        # What Django's create_cursor compares with the connection's zone (see the module doc).
        timezone = UTC

        def __init__(self, oid: int, context: Any = None) -> None:
            super().__init__(oid, context)
            self._c = _C_LOADER(oid, context)
            self.load = self._c.load  # type: ignore[method-assign]

        def load(self, data: Any) -> Any:
            return self._c.load(data)

    _LOADER_CLASS = UtcTimestamptzLoader


def timestamptz_loader_install(*, connection: Any) -> bool:
    """Read `timestamptz` through the C loader on this new Django connection, when its values
    are UTC both ways (see the module doc). Returns whether it did."""
    if _LOADER_CLASS is None or connection.vendor != "postgresql":
        return False
    if connection.timezone is not UTC:
        return False
    raw = connection.connection
    if raw is None or raw.info.parameter_status("TimeZone") != "UTC":
        return False
    raw.adapters.register_loader("timestamptz", _LOADER_CLASS)
    return True


def _on_connection_created(*, sender: Any, connection: Any, **_kwargs: Any) -> None:
    timestamptz_loader_install(connection=connection)


def pg_loaders_connect() -> None:
    """Install on every new connection (LedgerConfig.ready)."""
    from django.db.backends.signals import connection_created

    connection_created.connect(_on_connection_created, dispatch_uid="ledger.pg_loaders")
