"""Read-only views of the rollout: the shadow report and the audit trail."""

from __future__ import annotations

from typing import Any

from ledger.models import RolloutChange, ShadowComparison


def shadow_report(*, server_name: str | None = None, tool_name: str | None = None) -> dict[str, Any]:
    """Agreements and disagreements of shadow operations with their legacy calls."""
    rows = ShadowComparison.objects.select_related("legacy_operation__server")
    if server_name:
        rows = rows.filter(legacy_operation__server__name=server_name)
    if tool_name:
        rows = rows.filter(tool_name=tool_name)
    counts = {v: 0 for v in ShadowComparison.Verdict.values}
    disagreements: list[dict[str, Any]] = []
    for c in rows.order_by("created_at"):
        counts[c.verdict] += 1
        if c.verdict == ShadowComparison.Verdict.DISAGREE:
            disagreements.append({
                "call_node_id": c.call_node_id, "tool": c.tool_name,
                "shadow_operation": str(c.shadow_operation_id),
                "legacy_operation": str(c.legacy_operation_id),
                "shadow": [c.shadow_terminal_status, c.shadow_result_digest],
                "legacy": [c.legacy_terminal_status, c.legacy_result_digest],
                "detail": c.detail,
            })
    return {"counts": counts, "disagreements": disagreements}


def rollout_changes(*, limit: int = 50) -> list[dict[str, Any]]:
    return [
        {"id": c.pk, "action": c.action, "actor": c.actor, "reason": c.reason,
         "server": c.server.name if c.server else "*", "tool": c.tool_name or "*",
         "from": c.from_path, "to": c.to_path, "rows_moved": c.rows_moved,
         "before": c.before, "after": c.after, "at": c.created_at.isoformat()}
        for c in RolloutChange.objects.select_related("server").order_by("-created_at")[:limit]
    ]
