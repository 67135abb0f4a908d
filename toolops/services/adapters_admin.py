"""Adapter versions: enabled, draining or disabled (docs/architecture.md).

`adapter_version` on an operation picks its code path for the row's whole life; the status
here only governs NEW submissions:
* enabled  - submissions accepted;
* draining - new submissions refused with a clear error; polling, cancel, input and
             reconciliation of existing rows go on until they end;
* disabled - like draining, and allowed only once none of the version's rows is open.

Lock order (why it is race-free): a submit takes `FOR SHARE` on the version's AdapterState
row inside the transaction that inserts its operation; disabling takes `FOR UPDATE` on the
same row before counting open rows. A submit that got in first has committed its row before
the count runs (the UPDATE lock waits for the SHARE lock); a submit that comes second waits,
then reads `disabled` and is refused. Submits do not block each other (SHARE vs SHARE).
"""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction
from django.db.models import Count

from adapters import ADAPTER_VERSIONS
from ledger.models import AdapterState, Operation
from ledger.states import OPEN
from toolops.errors import SubmitRefused, ToolopsError


class AdapterBusy(ToolopsError):
    """Disabling refused: the version still has open operations."""


def _known(version: str) -> None:
    if version not in ADAPTER_VERSIONS:
        raise ToolopsError(f"unknown adapter version {version!r}; known: {', '.join(ADAPTER_VERSIONS)}")


def _state_row(version: str) -> None:
    # The row must exist for the lock to mean anything (a lock on no row orders nothing).
    # Created once per version; later calls only read.
    AdapterState.objects.get_or_create(adapter_version=version)


def adapter_state_ensure(*, version: str) -> None:
    """The version's state row, created (enabled) if it is not there yet: a server registered
    with a version makes its row, so no submission has to."""
    _known(version)
    _state_row(version)


def _status_shared(version: str) -> str | None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT status FROM {AdapterState._meta.db_table} "  # table name, no user input
            "WHERE adapter_version = %s FOR SHARE",
            [version],
        )
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def adapter_assert_accepting(*, version: str) -> None:
    """Refuse a new submission unless `version` is enabled. Call inside the transaction
    that inserts the operation (it takes the SHARE lock described in the module docstring)."""
    _known(version)
    if connection.vendor == "postgresql":
        shared = _status_shared(version)
        if shared is None:  # the version's first submission: create the row, then lock it
            _state_row(version)
            shared = _status_shared(version)
        assert shared is not None
        status = shared
    else:  # SQLite (embedded) serialises writers itself
        _state_row(version)
        status = AdapterState.objects.get(adapter_version=version).status
    adapter_status_check(version=version, status=status)


def adapter_status_check(*, version: str, status: str) -> None:
    """Refuse a new submission unless `status`, read under the SHARE lock in the inserting
    transaction (adapter_assert_accepting, or the submit's admission read), is enabled."""
    _known(version)
    if status != AdapterState.Status.ENABLED:
        raise SubmitRefused(
            f"adapter {version} is {status}: it takes no new submissions "
            "(its existing operations continue until they end)"
        )


def adapter_set_status(*, version: str, status: str, reason: str = "") -> AdapterState:
    """Drain, enable or disable an adapter version. Disabling needs zero open rows."""
    _known(version)
    if status not in AdapterState.Status.values:
        raise ToolopsError(f"unknown adapter status {status!r}")
    _state_row(version)
    with transaction.atomic(durable=True):
        row = AdapterState.objects.select_for_update().get(adapter_version=version)
        if status == AdapterState.Status.DISABLED:
            open_rows = Operation.objects.filter(adapter_version=version, state__in=OPEN).count()
            if open_rows:
                raise AdapterBusy(
                    f"cannot disable {version}: {open_rows} operation(s) still open; "
                    "drain it and wait until they end"
                )
        row.status = status
        row.reason = reason[:500]
        row.save(update_fields=["status", "reason", "changed_at"])
    return row


def adapter_list() -> list[dict[str, Any]]:
    """Every known version with its status and how many of its rows are open, per state."""
    statuses = dict(AdapterState.objects.values_list("adapter_version", "status"))
    open_counts: dict[str, dict[str, int]] = {}
    for row in (Operation.objects.filter(state__in=OPEN).values("adapter_version", "state")
                .annotate(n=Count("id"))):
        open_counts.setdefault(row["adapter_version"], {})[row["state"]] = row["n"]
    return [
        {
            "adapter_version": version,
            "status": statuses.get(version, AdapterState.Status.ENABLED),
            "open_operations": sum(open_counts.get(version, {}).values()),
            "open_by_state": open_counts.get(version, {}),
        }
        for version in ADAPTER_VERSIONS
    ]
