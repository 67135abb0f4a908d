"""Protocol-neutral values and the interface every task adapter implements.

The executor stores these values in the ledger and decides on them; adapters only
translate. Everything is frozen so an observation cannot be edited after it was recorded.
`raw` fields keep the server's JSON verbatim: the audit record and the result digest are
taken from what the server said, not from our parsed view of it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from adapters import limits
from adapters.decode import json_check, text

# What an adapter can do to resolve a submission whose answer was lost (docs/protocols.md).
# Which of them a given server allows is decided per server from its negotiated capabilities
# (`key_resolution_modes`), since the same adapter talks to cooperating and plain servers.
KEY_LOOKUP = "key_lookup"  # server answers "which task has this key?"; a miss fences the key: PROOF
KEY_DEDUP_RESEND = "key_dedup_resend"  # server dedups tools/call on the key: a resend is PROOF
LIST_SCAN = "list_scan"  # tasks/list filtered by creation time: CANDIDATES ONLY, never proof

# Called with a short label (the JSON-RPC method or HTTP call) before EVERY HTTP request an
# adapter sends, on the thread that sends it. It may wait briefly, or raise TransientError
# (nothing is sent). The executor installs one that spends a QPS token per request: one adapter
# call can send several requests (a key lookup then tasks/get, AIP-151's cancel then Get and its
# in-call retries, a session re-initialisation), and the per-server cap counts requests.
RequestGate = Callable[[str], None]


def session_digest(session_id: str | None) -> str:
    """A session id is a bearer credential: the ledger keeps only this digest of it."""
    if not session_id:
        return ""
    return "sha256:" + hashlib.sha256(session_id.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Negotiated:
    protocol_version: str
    session_id: str | None
    capabilities: dict[str, Any]
    server_info: dict[str, Any]
    supports_task_tools_call: bool
    supports_cancel: bool
    supports_list: bool


@dataclass(frozen=True)
class ToolDescriptor:
    name: str
    task_support: str  # "forbidden" | "optional" | "required"
    raw: dict[str, Any]  # the tools/list entry verbatim

    def __post_init__(self) -> None:
        text(self.name, field="tool name", max_chars=limits.TOOL_NAME_MAX_CHARS)
        json_check(self.raw, what="tool descriptor", strict_numbers=True)


@dataclass(frozen=True)
class FetchedResult:
    # "result" | "error" | "empty"; empty = mcp 1.30's _meta-only success for failed/cancelled
    kind: str
    payload: dict[str, Any]
    is_error: bool
    raw: dict[str, Any]

    def __post_init__(self) -> None:
        # Results are digested as canonical JSON and stored: checked strictly, whoever built them.
        json_check(self.payload, what="result", strict_numbers=True)
        json_check(self.raw, what="result reply", strict_numbers=True)


@dataclass(frozen=True)
class ServerRequest:
    request_id: str | int
    method: str
    params: dict[str, Any]
    related_task_id: str | None
    # `time.monotonic()` of this process when the stream that carried the request was opened, set
    # only by shapes whose server hands each request out once on that stream (2025-11-25's
    # tasks/result). A request read on a stream opened after its id's earlier round was delivered
    # cannot be that round's request again: the caller may then treat a reused id as a new round.
    # None: read from a reply or kept from an earlier read, so it may be a replay.
    stream_opened_at: float | None = None

    def __post_init__(self) -> None:
        json_check(self.params, what="input request params", strict_numbers=True)


@dataclass(frozen=True)
class RemoteTask:
    remote_id: str
    # The status the executor dispatches on: working | input_required | completed | failed |
    # cancelled. MCP shapes report it verbatim; AIP-151 has no status string, so its adapter
    # derives it from `done`/`error.code` (the Operation JSON stays verbatim in `raw`).
    status: str
    status_message: str | None
    poll_interval_ms: int | None
    ttl_ms: int | None
    created_at: str | None
    raw: dict[str, Any]
    # Shapes that carry the outcome inside the status read (the tasks extension's
    # `tasks/get`, AIP-151 `done` + `response`/`error`) put it here; the adapter's
    # `fetch_result` then returns it without another request. None for Shape A.
    result: FetchedResult | None = None
    # The tasks extension repeats pending input requests on every `tasks/get` (keyed by
    # server-minted keys, never reused): deduplicate by `request_id` across polls.
    input_requests: tuple[ServerRequest, ...] = ()
    # AIP-151 `metadata` (progress), verbatim; None when the server sent none.
    progress: dict[str, Any] | None = None


@dataclass(frozen=True)
class InputWindow:
    """What a bounded read of the task's input channel saw."""

    requests: tuple[ServerRequest, ...]
    result: FetchedResult | None


@dataclass(frozen=True)
class SubmitOutcome:
    task: RemoteTask | None
    sync_result: FetchedResult | None
    raw: dict[str, Any]


@dataclass(frozen=True)
class ResendRequest:
    """The original tools/call, for a dedup resend under the SAME submission key."""

    tool: str
    arguments: dict[str, Any]
    ttl_ms: int | None


@runtime_checkable
class TaskAdapter(Protocol):
    version: str
    capabilities: frozenset[str]  # e.g. {"cancel", "list", "lookup_by_key", "no_input"}

    def negotiate(self) -> Negotiated: ...

    def list_tools(self) -> list[ToolDescriptor]: ...

    def submit(
        self, *, tool: str, arguments: dict[str, Any], ttl_ms: int | None, submission_key: str
    ) -> SubmitOutcome: ...

    def call_sync(
        self, *, tool: str, arguments: dict[str, Any], timeout_s: float, submission_key: str
    ) -> FetchedResult: ...

    def get(self, *, remote_id: str) -> RemoteTask: ...

    def fetch_result(self, *, remote_id: str, timeout_s: float) -> FetchedResult: ...

    def read_input(self, *, remote_id: str, wait_s: float) -> InputWindow: ...

    def answer_input(self, *, request_id: str | int, result: dict[str, Any], remote_id: str) -> None: ...

    def cancel(self, *, remote_id: str) -> RemoteTask:
        """Request cancellation and return the task as the server reports it afterwards.

        Shape A confirms synchronously (`cancelled`). Adapters whose `capabilities` contain
        "cancel_ack_only" (the tasks extension, AIP-151) only get an acknowledgement: the
        returned task may still be `working`, and may end `completed` or `failed` later, so
        the executor MUST keep polling until a terminal status instead of treating the
        return value as the outcome.
        """
        ...

    def list_tasks(self) -> list[RemoteTask]: ...

    def key_resolution_modes(self, *, server_capabilities: Mapping[str, Any]) -> frozenset[str]:
        """Which of KEY_LOOKUP, KEY_DEDUP_RESEND, LIST_SCAN this server allows."""
        ...

    def lookup_by_key(
        self,
        *,
        submission_key: str,
        created_after: datetime,
        server_capabilities: Mapping[str, Any] | None = None,
        submitted_session: str | None = None,
        resend: ResendRequest | None = None,
    ) -> RemoteTask | None:
        """A returned task is PROOF that the server created it for this key (and we can reach it).

        None means "no proof either way". Raises NeverCreatedError only on the server's own proof
        that nothing exists for the key and nothing can be created for it any more, and
        SessionLostError when the key's task exists but in a session this client no longer holds.
        """
        ...

    def candidates_by_window(
        self, *, created_after: datetime, created_before: datetime
    ) -> list[RemoteTask]:
        """Tasks created in the window (tasks/list): CANDIDATES for an operator, never proof."""
        ...

    def set_request_gate(self, gate: RequestGate | None) -> None:
        """Install the gate every later HTTP request of this adapter passes (see RequestGate)."""
        ...

    def close(self) -> None: ...


__all__ = [
    "KEY_DEDUP_RESEND",
    "KEY_LOOKUP",
    "LIST_SCAN",
    "FetchedResult",
    "InputWindow",
    "Negotiated",
    "RemoteTask",
    "RequestGate",
    "ResendRequest",
    "ServerRequest",
    "SubmitOutcome",
    "TaskAdapter",
    "ToolDescriptor",
    "session_digest",
]
