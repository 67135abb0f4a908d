"""Finding a task after a lost create answer (Shape A adapter part; docs/protocols.md).

Nothing in MCP offers this (mcp-tasks.md section 5 point 1), so it rests on what a server declares.
PROOF: a cooperating server's key lookup (a hit, or a miss that fences the key) and its tools/call
dedup (a resend under the same key, in the same session, within the declared retention).
CANDIDATES ONLY: tasks/list entries created in the submission window.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from adapters import decode
from adapters.base import (
    KEY_DEDUP_RESEND,
    KEY_LOOKUP,
    LIST_SCAN,
    RemoteTask,
    ResendRequest,
    SubmitOutcome,
    session_digest,
)
from adapters.errors import (
    LostResponseError,
    NeverCreatedError,
    NotFoundError,
    ProtocolViolationError,
    SessionLostError,
    TransientError,
)
from adapters.jsonrpc import JsonRpcClient

SUBMISSION_KEY_META = "io.toolops/submission-key"
# A cooperating server declares, under initialize `capabilities.experimental[SUBMISSION_KEY_META]`:
#   {"dedup": {"scope": "session", "retentionMs": int | null},   # tools/call dedup on the key
#    "lookup": {"path": "/...", "fences": true}}                  # key lookup that fences on a miss
# Nothing in MCP itself offers either (mcp-tasks.md section 5 point 1); without the declaration
# the adapter never resends a tools/call and never reads absence as proof.
# A dedup resend is refused this close to the end of the declared retention: the resend must
# reach the server while its dedup entry is certainly still there.
DEDUP_RESEND_MARGIN_S = 5.0


def _submission_key_caps(server_capabilities: Mapping[str, Any] | None) -> dict[str, Any]:
    experimental = (server_capabilities or {}).get("experimental") or {}
    declared = experimental.get(SUBMISSION_KEY_META) if isinstance(experimental, dict) else None
    return declared if isinstance(declared, dict) else {}


def _lookup_path(server_capabilities: Mapping[str, Any] | None) -> str | None:
    lookup = _submission_key_caps(server_capabilities).get("lookup")
    if not isinstance(lookup, dict) or lookup.get("fences") is not True:
        return None  # a lookup that does not fence can never prove absence: not offered
    path = lookup.get("path")
    # Same origin only: a declared path, never a URL that could send our session elsewhere.
    if not isinstance(path, str) or not path.startswith("/") or path.startswith("//"):
        return None
    return path


def _dedup_retention(server_capabilities: Mapping[str, Any] | None) -> tuple[bool, float | None]:
    """(declared, retention seconds or None = as long as the session lives)."""
    dedup = _submission_key_caps(server_capabilities).get("dedup")
    if not isinstance(dedup, dict) or dedup.get("scope") != "session":
        return False, None
    retention = dedup.get("retentionMs")
    if retention is None:
        return True, None
    if not isinstance(retention, int) or retention <= 0:
        return False, None
    return True, retention / 1000.0


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


class SubmissionKeyResolution:
    """Mixed into the Shape A adapter, which provides the transport, session and task calls."""

    _rpc: JsonRpcClient
    _session_id: str | None

    def get(self, *, remote_id: str) -> RemoteTask:
        raise NotImplementedError

    def submit(
        self, *, tool: str, arguments: dict[str, Any], ttl_ms: int | None, submission_key: str
    ) -> SubmitOutcome:
        raise NotImplementedError

    def list_tasks(self) -> list[RemoteTask]:
        raise NotImplementedError


    def key_resolution_modes(self, *, server_capabilities: Mapping[str, Any]) -> frozenset[str]:
        modes: set[str] = set()
        if _lookup_path(server_capabilities) is not None:
            modes.add(KEY_LOOKUP)
        if _dedup_retention(server_capabilities)[0]:
            modes.add(KEY_DEDUP_RESEND)
        tasks = (server_capabilities or {}).get("tasks")
        if isinstance(tasks, dict) and tasks.get("list") is not None:
            modes.add(LIST_SCAN)
        return frozenset(modes)

    def lookup_by_key(
        self,
        *,
        submission_key: str,
        created_after: datetime,
        server_capabilities: Mapping[str, Any] | None = None,
        submitted_session: str | None = None,
        resend: ResendRequest | None = None,
    ) -> RemoteTask | None:
        """See TaskAdapter.lookup_by_key. Order: the fencing lookup (read-only, can prove both
        ways), then a dedup resend (can only prove presence, and creates the task if the first
        request never arrived: still one task per key). Never a resend under a new key."""
        path = _lookup_path(server_capabilities)
        if path is not None:
            return self._lookup_declared(path=path, submission_key=submission_key)
        if resend is not None and self._dedup_resend_safe(
            server_capabilities=server_capabilities, created_after=created_after,
            submitted_session=submitted_session,
        ):
            return self._dedup_resend(resend=resend, submission_key=submission_key)
        return None

    def _lookup_declared(self, *, path: str, submission_key: str) -> RemoteTask | None:
        url = str(httpx.URL(self._rpc.url).copy_with(path=path, query=None, fragment=None))
        response = self._rpc.post_json(url=url, body={"key": submission_key}, what="submission-key lookup")
        try:
            body = decode.json_loads(response.content, what="submission-key lookup")
        except ProtocolViolationError:
            body = {}
        body = body if isinstance(body, dict) else {}
        detail: dict[str, Any] = {"method": "submission-key lookup", "http_status": response.status_code}
        if response.status_code == 404:
            if body.get("fenced") is True:
                # PROOF of absence: the server has no task for the key and will refuse a late
                # arrival of the original request, so nothing can appear after this answer.
                raise NeverCreatedError("server fenced the submission key: no task exists", detail=detail)
            return None  # a miss without a fence proves nothing: the request may still land
        if response.status_code in (429, 503) or response.status_code >= 500:
            raise TransientError(f"submission-key lookup: HTTP {response.status_code}", detail=detail)
        task_id = body.get("taskId")
        if response.status_code != 200 or not isinstance(task_id, str):
            raise ProtocolViolationError("submission-key lookup: unreadable answer", detail=detail)
        task_id = decode.task_id(task_id)
        if body.get("sameSession") is not True:
            # The key's task exists, but in a session we no longer hold: it cannot be polled.
            raise SessionLostError(
                "the submission key's task lives in another session",
                detail={**detail, "remote_id": task_id},
            )
        try:
            # PROOF of presence: the server matched the key; tasks/get shows it is reachable.
            return self.get(remote_id=task_id)
        except NotFoundError as exc:
            exc.detail["remote_id"] = task_id
            raise

    def _dedup_resend_safe(
        self, *, server_capabilities: Mapping[str, Any] | None, created_after: datetime,
        submitted_session: str | None,
    ) -> bool:
        declared, retention_s = _dedup_retention(server_capabilities)
        if not declared:
            return False
        # Dedup is per session: in any other session the same key would create a SECOND task.
        if not submitted_session or submitted_session != session_digest(self._session_id):
            return False
        if retention_s is not None:
            limit = created_after + timedelta(seconds=retention_s - DEDUP_RESEND_MARGIN_S)
            if datetime.now(tz=UTC) >= limit:
                return False  # the dedup entry may be gone: a resend could create a second task
        return True

    def _dedup_resend(self, *, resend: ResendRequest, submission_key: str) -> RemoteTask | None:
        try:
            outcome = self.submit(
                tool=resend.tool, arguments=resend.arguments, ttl_ms=resend.ttl_ms,
                submission_key=submission_key,
            )
        except (LostResponseError, TransientError):
            return None  # no answer again: still unknown, try later under the same key
        except SessionLostError:
            return None  # our session is gone: says nothing about the task, and ends resends
        # PROOF of presence: the server declared that one key maps to one task in this session.
        return outcome.task

    def candidates_by_window(
        self, *, created_after: datetime, created_before: datetime
    ) -> list[RemoteTask]:
        # CANDIDATES ONLY: a Task carries no tool, arguments or key, and another client of the
        # same session may have created any of these. An operator decides, never this code.
        found = []
        for task in self.list_tasks():
            created = _parse_time(task.created_at)
            if created is not None and created_after <= created <= created_before:
                found.append(task)
        return found
