"""Submissions under a caller's idempotency key (the REST `Idempotency-Key` header).

The caller's key, scoped by tenant, becomes the operation's submission key: the unique column is
the guard (two concurrent requests with one key insert one row; the loser reads the winner's), and
it is also the key the tool server dedups on. A replay compares the digest of the submission as
sent: same body returns the existing operation, a different body is refused, and a row still in
SUBMITTING (its first request has not finished sending) is reported as in progress.
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785

from ledger.digests import canonical_digest
from ledger.models import Operation
from ledger.states import State
from toolops.errors import SubmissionKeyTaken, ToolopsError
from toolops.services.json_input import json_input_check
from toolops.services.permissions import SYSTEM, Action, Actor, permission_require
from toolops.services.submit import operation_submit

# Longest accepted Idempotency-Key; UUIDs and ULIDs fit with room to spare.
MAX_IDEMPOTENCY_KEY_LENGTH = 200


class IdempotencyMismatch(ToolopsError):
    """Same key, different submission (HTTP 422)."""


class IdempotencyInProgress(ToolopsError):
    """Same key, and the first submission is still being sent (HTTP 409)."""


def submission_key_for(*, tenant: str, idempotency_key: str) -> str:
    """Tenant-scoped so two tenants' keys never collide; hex so it fits the column and the wire."""
    return hashlib.sha256(f"{tenant}\x00{idempotency_key}".encode()).hexdigest()[:48]


def submission_digest_of(
    *, server_name: str, tool_name: str, call_node_id: str, arguments: dict[str, Any],
    ttl_ms: int | None,
) -> str:
    try:
        return canonical_digest({"server": server_name, "tool": tool_name, "call_node_id": call_node_id,
                                 "arguments": arguments, "ttl_ms": ttl_ms})
    except rfc8785.CanonicalizationError as exc:
        # Checked before any row is written: arguments the ledger cannot digest are refused whole.
        raise ToolopsError(f"arguments are not representable as canonical JSON (RFC 8785): {exc}") from exc


def _replay(*, op: Operation, digest: str) -> Operation:
    if op.submission_digest != digest:
        raise IdempotencyMismatch("this Idempotency-Key was used with a different submission")
    if op.state == State.SUBMITTING:
        raise IdempotencyInProgress("a submission with this Idempotency-Key is still being processed")
    return op


def operation_submit_idempotent(
    *, tenant: str, idempotency_key: str | None, server_name: str, tool_name: str,
    call_node_id: str, arguments: dict[str, Any] | None = None, ttl_ms: int | None = None,
    actor: Actor | str = SYSTEM,
) -> tuple[Operation, bool]:
    """Submit, or replay the submission made under the same key. Returns (operation, created)."""
    # Checked up front: a replay would otherwise show a refused principal the existing operation.
    permission_require(actor=actor, action=Action.SUBMIT, tenant=tenant)
    # Before canonicalisation digests it: canonical JSON cannot encode a lone surrogate.
    json_input_check({"server": server_name, "tool": tool_name, "call_node_id": call_node_id,
                      "arguments": arguments}, field="submission")
    args = dict(arguments or {})
    digest = submission_digest_of(server_name=server_name, tool_name=tool_name,
                                  call_node_id=call_node_id, arguments=args, ttl_ms=ttl_ms)
    if idempotency_key is None:
        return operation_submit(server_name=server_name, tool_name=tool_name, call_node_id=call_node_id,
                                arguments=args, ttl_ms=ttl_ms, tenant=tenant,
                                submission_digest=digest, actor=actor), True
    if not idempotency_key or len(idempotency_key) > MAX_IDEMPOTENCY_KEY_LENGTH:
        raise ToolopsError(f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} characters")
    key = submission_key_for(tenant=tenant, idempotency_key=idempotency_key)
    # The key check is the insert's own, in the submit's first transaction (operation_submit): a
    # new key costs no read at all; a taken key skips the insert and is read here, once.
    try:
        op = operation_submit(server_name=server_name, tool_name=tool_name,
                              call_node_id=call_node_id, arguments=args, ttl_ms=ttl_ms,
                              tenant=tenant, submission_key=key, submission_digest=digest,
                              actor=actor)
        return op, True
    except SubmissionKeyTaken:
        existing = Operation.objects.get(submission_key=key)
    return _replay(op=existing, digest=digest), False
