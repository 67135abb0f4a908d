"""Prints what the whole-message check of adapters.decode costs over plain json.loads.

Run: python -m benchmarks.decode_overhead [--size-kib N] [--repeat R]
Bodies: a typical tool result (text blocks plus structuredContent rows), at the given size.
"""

from __future__ import annotations

import argparse
import json
import time

from adapters import decode


def _body(size_kib: int) -> bytes:
    row_bytes = len(json.dumps({"id": 0, "name": "row 0", "score": 0.0, "tags": ["a", "b"], "ok": True}))
    rows = [{"id": n, "name": f"row {n}", "score": n / 7, "tags": ["a", "b"], "ok": True}
            for n in range(size_kib * 1024 // row_bytes)]
    result = {"content": [{"type": "text", "text": "x" * 200}], "structuredContent": {"rows": rows}}
    return json.dumps({"jsonrpc": "2.0", "id": "1", "result": result}).encode()


def _best(fn: object, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-kib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    body = _body(args.size_kib)
    plain = _best(lambda: json.loads(body), args.repeat)
    checked = _best(lambda: decode.json_loads(body, what="bench", strict_numbers=True), args.repeat)
    print(json.dumps({"body_bytes": len(body), "json_loads_ms": round(plain * 1000, 2),
                      "decode_json_loads_ms": round(checked * 1000, 2),
                      "overhead_ms": round((checked - plain) * 1000, 2)}))


if __name__ == "__main__":
    main()
