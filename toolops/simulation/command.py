"""`toolops simulate`: run, print the gate report (the same code as `toolops gate`) and run time."""

from __future__ import annotations

import time
from typing import Any, TextIO

from toolops.errors import ToolopsError
from toolops.gate_render import gate_render_json, gate_render_text, gate_summary
from toolops.simulation.progress import SimProgress, progress_line
from toolops.simulation.shards import result_summary, shard_report_write, simulate

# Failing series printed with their replay command (the rest are counted).
MAX_FAILURES_SHOWN = 20


def simulate_command(*, series: int, seed: int, only: int | None, workers: int,
                     lie_about: frozenset[int], as_json: bool, out: Any, err: Any,
                     shards: int = 1, shard: str | None = None, tag: str | None = None,
                     shard_report: str | None = None, servers: int | None = None) -> int:
    started = time.perf_counter()
    which, of = _shard_spec(shard, shards)
    prefix = f"[shard {which}/{of}] " if which is not None else ""

    def progress(p: SimProgress) -> None:
        # stderr: stdout stays the report alone (one JSON document with --json).
        err.write(prefix + progress_line(progress=p, elapsed_s=time.perf_counter() - started))
        flush = getattr(err, "flush", None)
        if flush is not None:
            flush()

    if shard_report is not None:
        # A shard process started by a sharded run: its outcome goes to the file, the verdict
        # and the report are the parent's.
        if which is None or tag is None:
            raise ToolopsError("--shard-report needs --shard K/N and --tag")
        shard_report_write(path=shard_report, series=series, seed=seed, shard=which, shards=of,
                           tag=tag, workers=workers, lie_about_series=lie_about, servers=servers,
                           on_progress=progress)
        return 0
    result = simulate(series=series, seed=seed, only=only, workers=workers, shards=of,
                      shard=which, servers=servers, lie_about_series=lie_about,
                      on_progress=progress)
    elapsed = round(time.perf_counter() - started, 1)
    summary = {**result_summary(result), "run_seconds": elapsed}
    failing = sorted(result.failing.items())[:MAX_FAILURES_SHOWN]
    replays: list[dict[str, Any]] = [
        {"series": i, "problems": p[:8], "replay": result.replay_command(i),
         **({"shard_replay": cmd} if (cmd := result.shard_replay_command(i)) else {})}
        for i, p in failing]
    if as_json:
        out.write(gate_render_json(result.gate, simulation=summary, failing=replays))
    else:
        _text(out=out, result_text=gate_render_text(result.gate), summary=summary)
    for row in replays:
        err.write(f"series {row['series']} failed: {'; '.join(row['problems'])}\n"
                  f"  replay: {row['replay']}"
                  + (f"\n  its shard, sequential: {row['shard_replay']}" if "shard_replay" in row else ""))
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


def _shard_spec(shard: str | None, shards: int) -> tuple[int | None, int]:
    """`--shard K/N` as (K, N); without it (None, `--shards`)."""
    if shard is None:
        return None, max(1, shards)
    try:
        k, n = (int(part) for part in shard.split("/", 1))
    except ValueError as exc:
        raise ToolopsError(f"--shard must read K/N, e.g. 0/4; got {shard!r}") from exc
    if n < 1 or not 0 <= k < n:
        raise ToolopsError(f"--shard {shard}: K must be within 0..N-1")
    return k, n
