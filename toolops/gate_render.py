"""Text and JSON rendering of the gate report (kept out of the CLI module to keep it thin)."""

from __future__ import annotations

import json
from typing import Any

from toolops.services.gate import GateReport


def gate_render_text(report: GateReport) -> str:
    lines = [f"{'figure':34} {'value':>14} {'threshold':>14}  result"]
    for f in report.figures:
        value = "n/a" if f.value is None else f"{f.value:g}"
        lines.append(f"{f.name:34} {value:>14} {f.comparison + ' ' + format(f.threshold, 'g'):>14}  "
                     f"{'PASS' if f.passed else 'FAIL'}")
    lines.append(gate_summary(report))
    return "\n".join(lines)


def gate_summary(report: GateReport) -> str:
    failed = [f.name for f in report.figures if not f.passed]
    if not failed:
        return f"gate: PASS ({len(report.figures)} figures)"
    return f"gate: FAIL ({', '.join(failed)})"


def gate_render_json(report: GateReport, **extra: Any) -> str:
    return json.dumps({**report.as_dict(), **extra}, sort_keys=True, default=str)
