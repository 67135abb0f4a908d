"""The one error taxonomy every adapter raises.

Callers branch on the class, never on messages: SDKs word the same condition differently
(mcp-tasks.md section 5.3), so the class is the only stable signal. `detail` carries what
an operator needs to read the event log (JSON-RPC code/message, HTTP status, method) and
never request headers or bodies, which may hold credentials.
"""

from __future__ import annotations

from typing import Any


class AdapterError(Exception):
    """Base class. Raised as-is for definite refusals that fit no narrower class."""

    def __init__(self, message: str, *, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.detail: dict[str, Any] = dict(detail or {})


class TransientError(AdapterError):
    """Safe to retry later: 429/5xx, JSON-RPC -32603, or transport trouble before the
    request can have reached the server (connect error, pool timeout)."""

    def __init__(
        self, message: str, *, detail: dict[str, Any] | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, detail=detail)
        self.retry_after: float | None = retry_after


class NotFoundError(AdapterError):
    """-32602 on a task method: unknown, expired, purged or bound to another session."""


class SessionLostError(NotFoundError):
    """HTTP 404 on a request that carried Mcp-Session-Id: every task in it is unreachable."""


class NeverCreatedError(NotFoundError):
    """Proof, from the server itself, that no task exists for a submission key and none can be
    created for it any more (the server fenced the key). The only NotFoundError that licenses a
    new attempt for the call node."""


class AlreadyTerminalError(AdapterError):
    """-32602 in answer to tasks/cancel: the task had already ended (only classified so in cancel)."""


class ProtocolViolationError(AdapterError):
    """The server's reply cannot be trusted: malformed JSON, wrong id, schema-invalid body,
    a result about another task, a refused protocol version, or an oversized body."""


class LostResponseError(AdapterError):
    """The request may have reached the server but no answer was read (read timeout,
    disconnect after send). For tools/call this means "maybe created": never resend blindly."""


class TaskNotSupportedError(AdapterError):
    """The server or the tool does not support task-augmented execution."""


__all__ = [
    "AdapterError",
    "AlreadyTerminalError",
    "LostResponseError",
    "NeverCreatedError",
    "NotFoundError",
    "ProtocolViolationError",
    "SessionLostError",
    "TaskNotSupportedError",
    "TransientError",
]
