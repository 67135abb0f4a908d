"""JSON-RPC messages as they come off the wire: the reply record, the envelope check and the
SSE framing. They work on what was read, never on a connection, and know no MCP method
(adapters.jsonrpc sends and reads).
"""

from __future__ import annotations

import codecs
import email.utils
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pydantic
from mcp_types import jsonrpc as rpc

from adapters.errors import ProtocolViolationError

Message = dict[str, Any]


@dataclass(frozen=True)
class RpcReply:
    """The response to one request, with its JSON-RPC error left for the caller to classify."""

    method: str
    message: Message  # the response envelope verbatim
    result: dict[str, Any] | None
    error: dict[str, Any] | None  # {"code", "message", "data"?}
    http_status: int
    session_id: str | None  # Mcp-Session-Id header of the HTTP reply
    others: tuple[Message, ...]  # server requests / notifications seen before the response


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds (delta-seconds or HTTP-date); None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value.strip()))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def validation_detail(exc: pydantic.ValidationError) -> dict[str, Any]:
    """Where and why a body failed its schema; never the offending values themselves."""
    return {"errors": [{"loc": list(e["loc"]), "type": e["type"]} for e in exc.errors()[:5]]}


def message_kind(message: Any) -> str:
    """'request' | 'notification' | 'response' | 'error', validated with mcp-types' envelopes."""
    if not isinstance(message, dict):
        raise ProtocolViolationError(
            "JSON-RPC message is not an object", detail={"type": type(message).__name__}
        )
    model: type[pydantic.BaseModel]
    if "method" in message:
        kind, model = (
            ("request", rpc.JSONRPCRequest) if "id" in message else ("notification", rpc.JSONRPCNotification)
        )
    elif "error" in message:
        kind, model = "error", rpc.JSONRPCError
    elif "result" in message:
        kind, model = "response", rpc.JSONRPCResponse
    else:
        raise ProtocolViolationError("JSON-RPC message has no method, result or error")
    try:
        model.model_validate(message)
    except pydantic.ValidationError as exc:
        raise ProtocolViolationError(f"invalid JSON-RPC {kind}", detail=validation_detail(exc)) from exc
    return kind


class SseParser:
    """Incremental text/event-stream parser (WHATWG rules, the subset MCP uses).

    Comment lines (':' keep-alives) and fields other than event/data are ignored; an
    event is dispatched on a blank line, so a stream cut mid-event yields nothing for it.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self._buffer = ""
        self._scanned = 0  # buffer prefix known to hold no line break
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        try:
            self._buffer += self._decoder.decode(chunk)
        except UnicodeDecodeError as exc:
            raise ProtocolViolationError("SSE stream is not UTF-8") from exc
        events: list[tuple[str, str]] = []
        while True:
            found = (self._buffer.find("\r", self._scanned), self._buffer.find("\n", self._scanned))
            cut = min((i for i in found if i >= 0), default=-1)
            if cut < 0 or (self._buffer[cut] == "\r" and cut == len(self._buffer) - 1):
                # No complete line yet (a trailing \r may be half of \r\n): remember how far we looked.
                self._scanned = len(self._buffer) if cut < 0 else cut
                return events
            line = self._buffer[:cut]
            skip = 2 if self._buffer.startswith("\r\n", cut) else 1
            self._buffer, self._scanned = self._buffer[cut + skip :], 0
            if line == "":
                if self._data:
                    events.append((self._event or "message", "\n".join(self._data)))
                self._event, self._data = "", []
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "event":
                    self._event = value
                elif name == "data":
                    self._data.append(value)
