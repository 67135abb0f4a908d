"""`toolops simulate`: run, print the gate report (the same code as `toolops gate`) and run time."""

from __future__ import annotations

import time
from typing import Any, TextIO

from toolops.gate_render import gate_render_json, gate_render_text, gate_summary
from toolops.simulation.progress import SimProgress, progress_line
from toolops.simulation.runner import result_summary, simulate

# Failing series printed with their replay command (the rest are counted).
MAX_FAILURES_SHOWN = 20


def simulate_command(*, series: int, seed: int, only: int | None, workers: int,
                     lie_about: frozenset[int], as_json: bool, out: Any, err: Any) -> int:
    started = time.perf_counter()

    def progress(p: SimProgress) -> None:
        # stderr: stdout stays the report alone (one JSON document with --json).
        err.write(progress_line(progress=p, elapsed_s=time.perf_counter() - started))
        flush = getattr(err, "flush", None)
        if flush is not None:
            flush()

    result = simulate(series=series, seed=seed, only=only, workers=workers,
                      lie_about_series=lie_about, on_progress=progress)
    elapsed = round(time.perf_counter() - started, 1)
    summary = {**result_summary(result), "run_seconds": elapsed}
    failing = sorted(result.failing.items())[:MAX_FAILURES_SHOWN]
    replays: list[dict[str, Any]] = [
        {"series": i, "problems": p[:5], "replay": result.replay_command(i)} for i, p in failing]
    if as_json:
        out.write(gate_render_json(result.gate, simulation=summary, failing=replays))
    else:
        _text(out=out, result_text=gate_render_text(result.gate), summary=summary)
    for row in replays:
        err.write(f"series {row['series']} failed: {'; '.join(row['problems'])}\n"
                  f"  replay: {row['replay']}")
    if len(result.failing) > MAX_FAILURES_SHOWN:
        err.write(f"... and {len(result.failing) - MAX_FAILURES_SHOWN} more failing series")
    if not result.passed:
        err.write(f"simulate: FAIL ({len(result.failing)} failing series; {gate_summary(result.gate)}; "
                  f"server peak/QPS {result.server_peak_over_qps})")
        return 1
    return 0


def _text(*, out: TextIO, result_text: str, summary: dict[str, Any]) -> None:
    out.write(result_text)
    out.write("simulation: " + ", ".join(f"{k}={v}" for k, v in summary.items()))
