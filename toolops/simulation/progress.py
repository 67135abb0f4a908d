"""Progress of a long simulation: how often to report, and what one report carries.

A 10,000-series run takes many minutes on a loaded machine; a line per step (on stderr, so
`--json` stdout stays one document) shows it is alive and how the gate figures stand so far.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ledger.models import TerminalReceipt, ToolServer
from toolops.services.gate import GateReport, gate_report
from toolops.simulation.server import SimServer

# One line per this many settled series at most (a 10,000-series run prints ten).
PROGRESS_STEP_SERIES = 1000


def progress_step(*, series: int) -> int:
    """Every 1,000 settled series, or every tenth of a smaller run."""
    return max(1, min(PROGRESS_STEP_SERIES, math.ceil(series / 10)))


@dataclass(frozen=True)
class SimProgress:
    settled: int  # series whose latest attempt has reached a final state
    series: int
    virtual_seconds: float
    polls: int
    gate: GateReport  # over the rows so far; divergence only for keys that already have a receipt


def progress_snapshot(*, sims: Sequence[SimServer], servers: Sequence[ToolServer], settled: int,
                      series: int, polls: int, virtual_seconds: float) -> SimProgress:
    """The gate over the rows so far, against the simulated servers' ground truth."""
    truth: dict[str, str] = {}
    counts: dict[str, int] = {}
    for sim in sims:
        truth.update(sim.truth())
        counts.update(sim.created_per_key)
    # Mid-run, a task the server finished but we have not yet accepted is not a divergence.
    receipted = set(TerminalReceipt.objects.filter(operation__server__in=servers)
                    .values_list("operation__submission_key", flat=True))
    gate = gate_report(server_names=[s.name for s in servers], peer_counts=counts,
                       ground_truth={k: v for k, v in truth.items() if k in receipted})
    return SimProgress(settled=settled, series=series, virtual_seconds=virtual_seconds, polls=polls,
                       gate=gate)


def progress_line(*, progress: SimProgress, elapsed_s: float) -> str:
    figures = ", ".join(
        f"{f.name} {'n/a' if f.value is None else format(f.value, 'g')} {'ok' if f.passed else 'FAIL'}"
        for f in progress.gate.figures)
    return (f"simulate: {progress.settled}/{progress.series} series settled, {elapsed_s:.0f} s elapsed "
            f"(virtual {progress.virtual_seconds:.0f} s, {progress.polls} polls); gate so far: {figures}")
