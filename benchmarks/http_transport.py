"""Benchmark (not a test): CPU per JSON-RPC exchange, httpx's transport beside ours, one run.

Sends the same `tasks/get` request `--requests` times over one keep-alive connection through
httpx's `HTTPTransport` (httpcore + h11) and through `adapters.http11.Http11Transport`
(`http.client`), alternating the two in `--rounds` rounds so that machine noise falls on both,
and prints this process's CPU per request for each and their ratio. Both are driven the way
`JsonRpcClient._post` drives them: an `httpx.Request` in, an `httpx.Response` read to its end.

The server is any MCP 2025-11-25 task server; the perf harness's fast server is the usual one:

    FAST_TASK_SECONDS=1 FAST_POLL_MS=500 python ../shared/perf/fastserver.py --port 8765 &
    .venv/bin/python benchmarks/http_transport.py --url http://127.0.0.1:8765/mcp

`--objects` needs no server: it times, with `timeit`, the two httpx objects every exchange builds
around `Http11Transport` (the request as `JsonRpcClient._post` builds it, and the response as
`Http11Transport.handle_request` builds it, read to its end and closed) and prints microseconds
per object, the best of `--rounds`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import timeit
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters.http11 import Http11Transport

HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
           "MCP-Protocol-Version": "2025-11-25"}
TIMEOUT = {"connect": 5.0, "read": 5.0, "write": 5.0, "pool": 5.0}


def _exchange(transport: httpx.BaseTransport, url: str, headers: dict[str, str], body: dict) -> dict:
    request = httpx.Request("POST", url, headers=headers, content=json.dumps(body).encode(),
                            extensions={"timeout": TIMEOUT})
    response = transport.handle_request(request)
    try:
        response.read()
    finally:
        response.close()
    if response.status_code != 200:
        raise SystemExit(f"{body['method']}: HTTP {response.status_code}")
    return {"headers": response.headers, "json": json.loads(response.content)}


def _rpc(request_id: int, method: str, params: dict) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def _task_id(transport: httpx.BaseTransport, url: str) -> tuple[dict[str, str], str]:
    headers = dict(HEADERS)
    hello = {"protocolVersion": "2025-11-25", "capabilities": {},
             "clientInfo": {"name": "bench", "version": "1"}}
    init = _exchange(transport, url, headers, _rpc(1, "initialize", hello))
    session = init["headers"].get("mcp-session-id")
    if session:
        headers["Mcp-Session-Id"] = session
    call = {"name": "work", "arguments": {"call_id": "bench"}, "task": {}}
    created = _exchange(transport, url, headers, _rpc(2, "tools/call", call))
    return headers, created["json"]["result"]["task"]["taskId"]


def _cpu_per_request(transport: httpx.BaseTransport, url: str, headers: dict[str, str], task_id: str,
                     n: int) -> float:
    body = _rpc(3, "tasks/get", {"taskId": task_id})
    started = time.process_time()
    for _ in range(n):
        _exchange(transport, url, headers, body)
    return (time.process_time() - started) / n * 1e6


def _object_costs(*, rounds: int) -> dict[str, float]:
    """Microseconds per httpx.Request and per httpx.Response (read and closed), best of `rounds`."""
    url = httpx.URL("http://127.0.0.1:8765/mcp")
    headers = httpx.Headers({name.lower(): value for name, value in HEADERS.items()})
    content = json.dumps(_rpc(7, "tasks/get", {"taskId": "0" * 32})).encode()
    body = b"x" * 180  # about a `tasks/get` reply
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
           (b"mcp-session-id", b"0123456789abcdef")]

    def request() -> None:
        httpx.Request("POST", url, headers=headers, content=content, extensions={"timeout": TIMEOUT})

    def response() -> None:
        reply = httpx.Response(200, headers=raw, stream=httpx.ByteStream(body),
                               extensions={"http_version": b"HTTP/1.1", "reason_phrase": b"OK"})
        reply.read()
        _ = "set-cookie" in reply.headers
        reply.close()

    n = 20_000
    return {name: min(timeit.repeat(fn, number=n, repeat=rounds)) / n * 1e6
            for name, fn in (("httpx.Request", request), ("httpx.Response", response))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8765/mcp")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--objects", action="store_true",
                        help="time the httpx request and response objects alone (no server)")
    args = parser.parse_args()
    if args.objects:
        for name, us in _object_costs(rounds=args.rounds).items():
            print(f"{name:>20}: {us:5.1f} us per object (best of {args.rounds} rounds of 20000)")
        return
    wires: dict[str, httpx.BaseTransport] = {"httpx.HTTPTransport": httpx.HTTPTransport(),
                                             "Http11Transport": Http11Transport()}
    sessions = {name: _task_id(wire, args.url) for name, wire in wires.items()}
    figures: dict[str, list[float]] = {name: [] for name in wires}
    for _ in range(args.rounds):
        for name, wire in wires.items():
            headers, task_id = sessions[name]
            figures[name].append(_cpu_per_request(wire, args.url, headers, task_id, args.requests))
    for wire in wires.values():
        wire.close()
    medians = {name: statistics.median(values) for name, values in figures.items()}
    for name, values in figures.items():
        print(f"{name:>20}: {medians[name]:7.1f} us CPU/request (median of {args.rounds} rounds of "
              f"{args.requests}; range {min(values):.1f}-{max(values):.1f})")
    print(f"{'ratio':>20}: Http11Transport / httpx.HTTPTransport = "
          f"{medians['Http11Transport'] / medians['httpx.HTTPTransport']:.3f}")


if __name__ == "__main__":
    main()
