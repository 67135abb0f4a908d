"""Progress of a long simulation: how often to report, and what one report carries.

A 10,000-series run takes many minutes on a loaded machine; a line per step (on stderr, so
`--json` stdout stays one document) shows it is alive and how the gate figures stand so far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolops.services.gate import GateReport

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


def progress_line(*, progress: SimProgress, elapsed_s: float) -> str:
    figures = ", ".join(
        f"{f.name} {'n/a' if f.value is None else format(f.value, 'g')} {'ok' if f.passed else 'FAIL'}"
        for f in progress.gate.figures)
    return (f"simulate: {progress.settled}/{progress.series} series settled, {elapsed_s:.0f} s elapsed "
            f"(virtual {progress.virtual_seconds:.0f} s, {progress.polls} polls); gate so far: {figures}")
