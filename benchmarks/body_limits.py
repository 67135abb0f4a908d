"""How long the API's JSON parser takes to refuse (or accept) hostile bodies at the size limit.

Run: python benchmarks/body_limits.py
Prints, per body shape of TOOLOPS_MAX_REQUEST_BYTES, the median time of the depth scan alone and
of the whole parse (scan, json.loads, the NUL / lone-surrogate walk), and the ratio between the
full-size and the quarter-size body: about 4 means linear. No database is needed.
"""

from __future__ import annotations

import io
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django

django.setup()

from django.conf import settings  # noqa: E402
from rest_framework.exceptions import APIException  # noqa: E402

from toolops.rest.parsers import BoundedJSONParser, json_depth  # noqa: E402

RUNS = 3
SHAPES: dict[str, Callable[[int], str]] = {
    "escaped quotes, unterminated": lambda n: '"' + '\\"' * (n // 2 - 1),
    "quotes only": lambda n: '"' * n,
    "many short strings": lambda n: "[" + '"a",' * (n // 4 - 2) + '"a"]',
    "deep nesting": lambda n: "[" * (n // 2) + "]" * (n // 2),
    "flat numbers": lambda n: "[" + "1," * (n // 2 - 2) + "1]",
    "surrogate escapes": lambda n: '["' + "\\ud800" * (n // 6 - 1) + '"]',
    # A NUL escape forces the field walk over a million-element list (the walk's worst case).
    "flat numbers, one NUL at the end": lambda n: "[" + "1," * (n // 2 - 8) + '"\\u0000"]',
}


def _median(fn: Callable[[], object]) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _parse(body: bytes) -> None:
    try:
        BoundedJSONParser().parse(io.BytesIO(body))
    except APIException:
        pass


def main() -> None:
    limit = int(settings.TOOLOPS_MAX_REQUEST_BYTES)
    print(f"limit {limit} bytes, median of {RUNS} runs")
    print(f"{'shape':<32} {'scan s':>8} {'parse s':>8} {'parse(n)/parse(n/4)':>20}")
    for name, make in SHAPES.items():
        full, quarter = make(limit).encode(), make(limit // 4).encode()
        scan = _median(lambda b=full: json_depth(b.decode()))
        parse = _median(lambda b=full: _parse(b))
        parse_q = _median(lambda b=quarter: _parse(b))
        print(f"{name:<32} {scan:>8.3f} {parse:>8.3f} {parse / max(parse_q, 1e-9):>20.1f}")


if __name__ == "__main__":
    main()
