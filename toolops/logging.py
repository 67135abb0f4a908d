"""Structured JSON logs (structlog) with the operation's identity on every line, and no secrets.

Every line carries `operation_id`, `call_node_id`, `server` and `adapter_version` (null outside an
operation's context), so a log search by operation id finds the whole story. The context is held in
contextvars (`operation_log_context`), which is per thread and per asyncio task, so concurrent
requests in one process never mix their identities.

Redaction is by key, recursively: secrets (tokens, passwords, authorization headers, cookies) and
full results (payload, result, arguments, answers) never reach a handler; a redacted value is
replaced by its size so a log still says that something was there.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar, cast

import structlog

P = ParamSpec("P")
R = TypeVar("R")

OPERATION_FIELDS = ("operation_id", "call_node_id", "server", "adapter_version")

# Lower-cased key fragments whose values are credentials: never logged.
SECRET_KEY_PARTS = ("secret", "token", "password", "authorization", "cookie", "api_key", "apikey",
                    "credential", "session_id")
# Keys whose values are tool results or user data: logged as a size only.
RESULT_KEYS = frozenset({"result", "results", "payload", "arguments", "answer", "response",
                         "structuredcontent", "content", "late_result", "body"})
# Bounds the work of redacting deeply nested values; deeper levels are dropped whole.
MAX_REDACT_DEPTH = 6


def _size(value: Any) -> int:
    try:
        return len(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return len(str(value))


def _redact(value: Any, depth: int = 0) -> Any:
    if depth > MAX_REDACT_DEPTH:
        return "[truncated]"
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            lowered = str(key).lower()
            if any(part in lowered for part in SECRET_KEY_PARTS):
                out[key] = "[redacted]"
            elif lowered in RESULT_KEYS:
                out[key] = f"[redacted {_size(item)} bytes]"
            else:
                out[key] = _redact(item, depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_redact(v, depth + 1) for v in value]
    return value


def redact_processor(_logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> Any:
    """structlog processor: redact secrets and results from every key but the message itself."""
    message = event_dict.pop("event", None)
    cleaned = _redact(dict(event_dict))
    event_dict.clear()
    event_dict.update(cleaned)
    if message is not None:
        event_dict["event"] = message
    return event_dict


def operation_fields_processor(_logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> Any:
    """Every line names the operation fields, null when the line is not about an operation."""
    for name in OPERATION_FIELDS:
        event_dict.setdefault(name, None)
    return event_dict


SHARED_PROCESSORS: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    operation_fields_processor,
    redact_processor,
]


def logging_config(*, level: str) -> dict[str, Any]:
    """A `LOGGING` dict: stdlib loggers (ledger, toolops, django) render through the same JSON chain."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "json": {
                "()": structlog.stdlib.ProcessorFormatter,
                "processors": [
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info,
                    structlog.processors.JSONRenderer(default=str),
                ],
                "foreign_pre_chain": SHARED_PROCESSORS,
            },
        },
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json"}},
        "loggers": {
            "toolops": {"handlers": ["console"], "level": level, "propagate": False},
            "ledger": {"handlers": ["console"], "level": level, "propagate": False},
            # httpx logs every request URL at INFO; URLs may carry credentials.
            "httpx": {"level": "WARNING"},
            "httpcore": {"level": "WARNING"},
        },
    }


_configured = False


def _configure() -> None:
    global _configured
    if _configured:
        return
    structlog.configure(
        processors=[*SHARED_PROCESSORS, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    _configured = True


def get_logger(name: str) -> Any:
    """A structlog logger writing through the stdlib `name` logger (and so the JSON formatter)."""
    _configure()
    return structlog.get_logger(name)


@contextmanager
def operation_log_context(
    *, operation_id: Any, call_node_id: str, server: str, adapter_version: str
) -> Iterator[None]:
    """Bind the operation's identity to every log line inside the block (this thread/task only)."""
    with structlog.contextvars.bound_contextvars(
        operation_id=str(operation_id), call_node_id=call_node_id, server=server,
        adapter_version=adapter_version,
    ):
        yield


def operation_log_context_for(op: Any) -> Any:
    """`operation_log_context` from an Operation row (server name read from the cached relation)."""
    return operation_log_context(
        operation_id=op.id, call_node_id=op.call_node_id, server=op.server.name,
        adapter_version=op.adapter_version,
    )


def stdlib_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)


def operation_logged(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorator for services called with `operation_id=`: their log lines carry the operation's
    identity. Costs one indexed read; a missing row logs with the id alone."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        from ledger.models import Operation

        operation_id = cast("uuid.UUID | str | None", kwargs.get("operation_id"))
        op = (Operation.objects.select_related("server").only(
            "id", "call_node_id", "adapter_version", "server__name").filter(id=operation_id).first()
            if operation_id is not None else None)
        if op is None:
            with structlog.contextvars.bound_contextvars(operation_id=str(operation_id)):
                return fn(*args, **kwargs)
        with operation_log_context_for(op):
            return fn(*args, **kwargs)

    return wrapper
