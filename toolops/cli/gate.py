"""`toolops gate`: the release gate over the ledger; exit 1 when any figure fails."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from toolops.cli.base import Output

NAME = "gate"
HELP = "the release gate: eight figures, exit 1 on any failure"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--server", action="append", default=None, help="limit to these servers")


def run(*, opts: dict[str, Any], out: Output, err: Output) -> int | None:
    from toolops.gate_render import gate_render_json, gate_render_text, gate_summary
    from toolops.services.gate import gate_report

    report = gate_report(server_names=opts["server"])
    out.write(gate_render_json(report) if opts["json"] else gate_render_text(report))
    if not report.passed:
        err.write(gate_summary(report))
        return 1
    return None
