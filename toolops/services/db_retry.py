"""Database-write helpers under the executor: redacted exception summaries and retries over a
lost connection. At the bottom of the services (no service imports), so the submit path and the
per-row error boundary (boundary.py) share them without a circle.
"""

from __future__ import annotations

import logging
import re
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection

logger = logging.getLogger("toolops.db_retry")

T = TypeVar("T")

# A redacted message never carries more than this; quoted text longer than QUOTED_MAX (a value
# from a server answer, a payload fragment) is replaced by its length.
MESSAGE_MAX = 200
QUOTED_MAX = 40
_QUOTED = re.compile(r"""(['"])(.{""" + str(QUOTED_MAX + 1) + r""",}?)\1""", re.DOTALL)
# A database error's DETAIL / "Failing row contains (...)" lines carry the row's values.
_DETAIL = re.compile(r"(DETAIL:|Failing row contains|CONTEXT:).*", re.DOTALL)
RECORD_BACKOFF_SECONDS = (0.2, 0.5, 1.0, 2.0)

def exception_redacted(exc: BaseException) -> dict[str, Any]:
    """Type, one short line of message and the raising frame: enough to triage, no payloads."""
    text = str(exc)
    text = _DETAIL.sub("", text).strip().splitlines()[0] if text.strip() else ""
    text = _QUOTED.sub(lambda m: f"<{len(m.group(2))} chars>", text)
    if len(text) > MESSAGE_MAX:
        text = text[:MESSAGE_MAX] + "…"
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    if frames:
        last = frames[-1]
        where = f"{last.filename.rsplit('/', 1)[-1]}:{last.lineno} {last.name}"
    return {"type": f"{type(exc).__module__}.{type(exc).__qualname__}", "message": text,
            "where": where}


def db_connection_reopen() -> None:
    """Drop a broken connection so the next query opens a fresh one (never inside a caller's
    transaction: that would end it)."""
    if not connection.in_atomic_block:
        close_old_connections()
        if connection.connection is not None and not connection.is_usable():
            connection.close()


def db_write_retrying(fn: Callable[[], T], *, what: str) -> T:
    """Run a write, retrying on a lost or refused database connection with backoff.

    Only connection-level failures are retried (OperationalError, InterfaceError); anything else
    is a real answer from the database and is raised at once. The last failure is raised.
    """
    tries = 1 + int(settings.TOOLOPS_DB_WRITE_RETRIES)
    for attempt in range(tries):
        try:
            return fn()
        except (OperationalError, InterfaceError) as exc:
            if attempt + 1 >= tries or connection.in_atomic_block:
                raise
            logger.warning("%s failed (%s), retrying", what, exception_redacted(exc)["message"])
            db_connection_reopen()
            time.sleep(RECORD_BACKOFF_SECONDS[min(attempt, len(RECORD_BACKOFF_SECONDS) - 1)])
    raise AssertionError("unreachable")
