"""What every subcommand shares: JSON arguments, JSON output, the operation reference lookup."""

from __future__ import annotations

import json
from typing import Any, Protocol

from django.core.management.base import CommandError

from ledger.models import Operation
from ledger.selectors import operation_find


class Output(Protocol):
    """Django's OutputWrapper (or any stream): `write` adds the newline."""

    def write(self, msg: str = "", style_func: Any = None, ending: str | None = None) -> None: ...


def json_arg(raw: str | None, *, flag: str) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CommandError(f"{flag} is not valid JSON: {exc.msg} at position {exc.pos}") from exc


def json_object_arg(raw: str | None, *, flag: str) -> dict[str, Any] | None:
    value = json_arg(raw, flag=flag)
    if value is not None and not isinstance(value, dict):
        raise CommandError(f"{flag} must be a JSON object")
    return value


def print_json(out: Output, value: Any) -> None:
    out.write(json.dumps(value, sort_keys=True, default=str))


def operation_by_ref(*, ref: str) -> Operation:
    """An operation by its id, remote (task) id or submission key, or a one-line refusal."""
    op = operation_find(ref=ref)
    if op is None:
        raise CommandError(f"no operation matches {ref!r}")
    return op


def add_operation_ref(parser: Any) -> None:
    parser.add_argument("operation", help="operation id, remote (task) id or submission key")
