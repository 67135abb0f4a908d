"""Structured JSON logs (structlog) with the operation's identity on every line, and no secrets.

Every line carries `operation_id`, `call_node_id`, `server` and `adapter_version` (null outside an
operation's context), so a log search by operation id finds the whole story. The context is held in
contextvars (`operation_log_context`), which is per thread and per asyncio task, so concurrent
requests in one process never mix their identities.

Redaction, before any handler sees a line:
* by key, recursively, case- and separator-insensitive (`X-Api-Key`, `api_key` and `APIKEY` are
  one key): credentials (SECRET_KEY_PARTS, SECRET_KEYS) become "[redacted]"; full results
  (payload, result, arguments, answers) become their size, so a log still says something was there;
* by pattern, in every string (the message, values, exception messages and rendered tracebacks):
  userinfo and credential-like query parameters in URLs, `Bearer`/`Basic`/`Token` credentials,
  and the parts of a database error that quote a row's values (DETAIL, CONTEXT, LINE, the value
  of "invalid input syntax ...: \"...\"").
`redact_text` and `redacted_excepthook` apply the same patterns to anything printed outside the
log (an uncaught traceback on stderr).
"""

from __future__ import annotations

import functools
import json
import logging
import re
import sys
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar, cast

import structlog

P = ParamSpec("P")
R = TypeVar("R")

OPERATION_FIELDS = ("operation_id", "call_node_id", "server", "adapter_version")

# Key fragments (lower-cased, separators removed) whose values are credentials: never logged.
SECRET_KEY_PARTS = ("secret", "token", "password", "passwd", "authorization", "cookie", "apikey",
                    "credential", "sessionid", "privatekey", "accesskey", "signature", "passphrase")
# Whole keys (normalised the same way) that are credentials but too short to match as fragments.
SECRET_KEYS = frozenset({"auth", "pwd", "pass", "session", "sig", "jwt", "bearer", "xauth",
                         "proxyauth", "basicauth", "otp", "pin"})
_NOT_ALNUM = re.compile(r"[^a-z0-9]")
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


def secret_key(key: Any) -> bool:
    """Whether a mapping key names a credential (case- and separator-insensitive)."""
    norm = _NOT_ALNUM.sub("", str(key).lower())
    return norm in SECRET_KEYS or any(part in norm for part in SECRET_KEY_PARTS)


# Credential-like query parameter names inside URLs (same normalisation as keys, but matched on
# the raw name with separators allowed).
_QUERY_SECRET = re.compile(
    r"(?i)([?&;](?:[a-z0-9_.-]*(?:token|secret|passw(?:or)?d|pwd|api[-_]?key|access[-_]?key|"
    r"private[-_]?key|signature|session(?:[-_]?id)?|credential)[a-z0-9_.-]*|auth|key|sig|jwt|code)=)"
    r"[^&#\s\"']*")
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@\"'<>]+@")
_AUTH_SCHEME = re.compile(r"(?i)\b(bearer|basic|token|digest)\s+[a-z0-9._~+/=-]{6,}")
# A database error's lines that quote a row: PostgreSQL's DETAIL/CONTEXT/LINE/QUERY/STATEMENT.
_DB_DETAIL = re.compile(
    r"(?m)^(\s*(?:DETAIL|CONTEXT|LINE \d+|QUERY|STATEMENT|WHERE):|"
    r"\s*(?:unnamed portal|portal \S+) parameter \$\d+ =).*$")
_DB_VALUE = re.compile(r"(?i)(invalid input (?:syntax|value) for [\w ]+?)(?::\s*\".*?\"|:\s*\S+)")
_KEY_VALUE_SECRET = re.compile(
    r"(?i)([\"']?(?:[a-z0-9_-]*(?:password|passwd|secret|token|api[-_]?key|access[-_]?key|"
    r"private[-_]?key|authorization|cookie)|pwd|auth)[\"']?\s*[:=]\s*)([\"'][^\"']*[\"']|[^\s,;}&]+)")


def redact_text(text: str) -> str:
    """Credentials in free text (URLs, auth headers, key=value, database error details)."""
    if not text:
        return text
    text = _USERINFO.sub(r"\1[redacted]@", text)
    text = _QUERY_SECRET.sub(r"\1[redacted]", text)
    text = _AUTH_SCHEME.sub(r"\1 [redacted]", text)
    text = _KEY_VALUE_SECRET.sub(r"\1[redacted]", text)
    text = _DB_DETAIL.sub(r"\1 [redacted]", text)
    return _DB_VALUE.sub(r"\1: [redacted]", text)


def _redact(value: Any, depth: int = 0) -> Any:
    if depth > MAX_REDACT_DEPTH:
        return "[truncated]"
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if secret_key(key):
                out[key] = "[redacted]"
            elif str(key).lower() in RESULT_KEYS:
                out[key] = f"[redacted {_size(item)} bytes]"
            else:
                out[key] = _redact(item, depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_redact(v, depth + 1) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, BaseException):
        return redact_text(f"{type(value).__name__}: {value}")
    return value


def redact_processor(_logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> Any:
    """structlog processor: redact secrets and results by key, and credentials by pattern in
    every string, the message included. `exc_info` is left for the formatter (redacted after)."""
    message = event_dict.pop("event", None)
    exc_info = event_dict.pop("exc_info", None)
    cleaned = _redact(dict(event_dict))
    event_dict.clear()
    event_dict.update(cleaned)
    if message is not None:
        event_dict["event"] = redact_text(message) if isinstance(message, str) else message
    if exc_info is not None:
        event_dict["exc_info"] = exc_info
    return event_dict


def redact_rendered_processor(_logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> Any:
    """After tracebacks are rendered to text: the same patterns over the traceback and message."""
    for key in ("exception", "stack", "event"):
        if isinstance(event_dict.get(key), str):
            event_dict[key] = redact_text(event_dict[key])
    return event_dict


def redacted_excepthook(exc_type: Any, exc: BaseException, tb: Any) -> None:
    """sys.excepthook: an uncaught traceback on stderr passes the same patterns."""
    sys.stderr.write(redact_text("".join(traceback.format_exception(exc_type, exc, tb))))


def install_redacted_excepthook() -> None:
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = redacted_excepthook


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
                    redact_rendered_processor,
                    structlog.processors.JSONRenderer(default=str),
                ],
                "foreign_pre_chain": SHARED_PROCESSORS,
            },
        },
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json"}},
        # Everything else (django.request's tracebacks, libraries) through the same redacting
        # JSON chain: with no root handler, Python's last-resort handler would print it raw.
        "root": {"handlers": ["console"], "level": "WARNING"},
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
        # A line below the stdlib logger's level is dropped first, before the chain builds it
        # (a debug line on every poll otherwise cost a tenth of the poll's CPU).
        processors=[structlog.stdlib.filter_by_level, *SHARED_PROCESSORS,
                    structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
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
