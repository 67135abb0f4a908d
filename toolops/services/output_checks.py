"""Tool output defense, the checks: the validator pipeline a result passes before it may be accepted.

This module only judges (it writes nothing), so the reconciliation services can hold an operator's
attested evidence to the same pipeline without importing the write side (output_defense.py).

Checks, in order: size cap, allowed content block types, the tool's declared `outputSchema`
(structured content, validated with the `jsonschema` library under the schema's own draft), then
custom hooks named by dotted path in settings. A result that fails is never accepted as a success
and never dropped: the caller records the reasons in the ledger and, per
TOOLOPS_OUTPUT_DEFENSE_POLICY, sends the operation to reconciliation or accepts it as failed.

Cancelled outcomes carry no accepted payload (a late result is audit-only), so they are not checked.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from ledger.models import Operation

POLICY_RECONCILE = "reconcile"
POLICY_FAIL = "fail"
POLICIES = frozenset({POLICY_RECONCILE, POLICY_FAIL})

# A hook names at most this many problems; the ledger event stays small whatever a hook returns.
MAX_REASONS = 20
# One schema error message is cut to this length in the ledger (enough to locate the field).
MAX_REASON_CHARS = 300


@dataclass(frozen=True)
class DefenseVerdict:
    reasons: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.reasons


def _size_check(*, stored: dict[str, Any]) -> list[str]:
    cap = int(settings.TOOLOPS_OUTPUT_MAX_BYTES)
    size = len(json.dumps(stored.get("payload"), separators=(",", ":"), default=str).encode())
    return [f"result is {size} bytes, over the {cap} byte cap"] if size > cap else []


def _content_type_check(*, payload: dict[str, Any]) -> list[str]:
    allowed = {t.strip() for t in settings.TOOLOPS_OUTPUT_ALLOWED_CONTENT_TYPES if t.strip()}
    content = payload.get("content")
    if content is None:
        return []
    if not isinstance(content, list):
        return ["result content is not a list of content blocks"]
    problems = []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in allowed:
            problems.append(f"content[{i}] has type {kind!r}, not one of {sorted(allowed)}")
    return problems


def _output_schema(*, op: Operation) -> dict[str, Any] | None:
    tool = op.server.tools.get(op.tool_name) or {}
    schema = (tool.get("descriptor") or {}).get("outputSchema")
    return schema if isinstance(schema, dict) else None


def _schema_check(*, op: Operation, payload: dict[str, Any]) -> list[str]:
    schema = _output_schema(op=op)
    if schema is None:
        return []
    # MCP: a tool with an outputSchema MUST return structuredContent conforming to it (for
    # successful results; a tool error reports in content and is not held to the schema).
    if "structuredContent" not in payload:
        return ["tool declares an outputSchema but the result has no structuredContent"]
    # Imported on first use: workers that never meet an outputSchema do not pay for it at start-up.
    import jsonschema

    try:
        validator_cls = jsonschema.validators.validator_for(schema)
        validator_cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return [f"the tool's outputSchema is invalid: {exc.message[:MAX_REASON_CHARS]}"]
    validator = validator_cls(schema)
    errors = sorted(validator.iter_errors(payload["structuredContent"]), key=lambda e: list(e.path))
    return [
        f"structuredContent{''.join(f'[{p!r}]' for p in e.path)}: {e.message[:MAX_REASON_CHARS]}"
        for e in errors[:MAX_REASONS]
    ]


def _hooks() -> list[Callable[..., list[str]]]:
    return [import_string(path) for path in settings.TOOLOPS_OUTPUT_VALIDATORS]


def result_defend(*, op: Operation, stored: dict[str, Any], terminal_status: str) -> DefenseVerdict:
    """Run the pipeline over a stored result (the `result_stored` shape in settle_cycle.py)."""
    if terminal_status == "cancelled" or stored.get("payload") is None:
        return DefenseVerdict()
    payload = stored["payload"]
    if not isinstance(payload, dict):
        return DefenseVerdict(reasons=["result payload is not a JSON object"])
    reasons = _size_check(stored=stored)
    if reasons:
        # Past the cap nothing else is inspected: validating a huge body is the attack.
        return DefenseVerdict(reasons=reasons)
    reasons += _content_type_check(payload=payload)
    if stored.get("kind") == "result" and not stored.get("is_error"):
        reasons += _schema_check(op=op, payload=payload)
    for hook in _hooks():
        found = hook(operation=op, result=stored)
        reasons += [str(r)[:MAX_REASON_CHARS] for r in list(found or [])[:MAX_REASONS]]
    return DefenseVerdict(reasons=reasons[:MAX_REASONS])


def defense_policy() -> str:
    policy = str(settings.TOOLOPS_OUTPUT_DEFENSE_POLICY)
    if policy not in POLICIES:
        raise RuntimeError(f"TOOLOPS_OUTPUT_DEFENSE_POLICY must be one of {sorted(POLICIES)}, got {policy!r}")
    return policy


def rejected_result(*, stored: dict[str, Any], reasons: list[str], original_digest: str) -> dict[str, Any]:
    """What is stored (and accepted as `failed` under the fail policy) in place of a rejected result.

    The rejected payload itself is not kept as the outcome; its digest is, so the audit can match
    it against the server's answer.
    """
    return {
        "kind": "error",
        "payload": {"isError": True, "rejected_by_output_defense": reasons,
                    "original_kind": stored.get("kind"), "original_result_digest": original_digest},
        "is_error": True,
        "status_message": "result rejected by output defense",
    }
