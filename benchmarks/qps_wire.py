"""Benchmark (not a test): the QPS cap as the server's door sees it.

A counting pass-through proxy (its own process, its own clock) sits in front of the reference MCP
server (official `mcp` SDK, tests/peers/mcp_server.py). `server-add` negotiates through it, calls
are submitted through it, and 1, 2 or 4 worker processes (`manage.py toolops run`, one process
each, sharing the Redis bucket as a fleet does) poll them to their receipts through it. The proxy
stamps every HTTP request when it arrives; the figure printed is the largest number of arrivals
in ANY sliding one-second window, against the configured cap, next to what the bucket counted
(grants per calendar second; grants abandoned past their send deadline are not requests).

Run (PostgreSQL and Redis; a scratch database it migrates itself):
    DATABASE_URL=postgres://root@127.0.0.1:5432/toolops_sim_h14 \\
    CELERY_BROKER_URL=redis://127.0.0.1:6379/3 .venv/bin/python benchmarks/qps_wire.py
Options: --caps 3,20 --workers 1,2,4 --ops N --seconds S.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


# -- the counting proxy (runs in its own process) -----------------------------------------------


def proxy_main(*, port: int, upstream: str, log: str) -> None:
    import httpx
    import uvicorn
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    client = httpx.AsyncClient(timeout=httpx.Timeout(60.0), limits=httpx.Limits(max_connections=200))
    out = open(log, "a", buffering=1)
    hop = {"content-length", "transfer-encoding", "connection", "keep-alive"}

    async def forward(request: Request) -> Response:
        arrived = time.time()  # the door: headers read, before anything else is done
        body = await request.body()
        try:
            method = str(json.loads(body).get("method") or "response") if body else request.method
        except (ValueError, AttributeError):
            method = "?"
        out.write(f"{arrived:.6f} {method}\n")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop | {"host"}}
        upstream_request = client.build_request(
            request.method, upstream + request.url.path, content=body, headers=headers,
            params=dict(request.query_params),
        )
        reply = await client.send(upstream_request, stream=True)
        reply_headers = {k: v for k, v in reply.headers.items() if k.lower() not in hop}
        return StreamingResponse(reply.aiter_raw(), status_code=reply.status_code,
                                 headers=reply_headers, background=BackgroundTask(reply.aclose))

    app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST", "DELETE"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# -- the measurement ----------------------------------------------------------------------------


def peak_in_sliding_second(times: list[float]) -> int:
    """The most arrivals in any half-open window [t, t + 1 s)."""
    times = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - 1.0:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"nothing listens on {port}")


def _spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def measure(*, cap: float, workers: int, ops: int, seconds: float, upstream: str,
            tmp: Path) -> dict[str, Any]:
    from ledger.models import Operation
    from ledger.states import State
    from toolops.qps import qps_bucket, server_bucket_key
    from toolops.services.servers import server_add
    from toolops.services.submit import operation_submit

    port = _free_port()
    log = tmp / f"arrivals-{cap}-{workers}.log"
    log.write_text("")
    proxy = _spawn([sys.executable, __file__, "proxy", "--port", str(port), "--upstream", upstream,
                    "--log", str(log)], tmp / "proxy.out")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        _wait_port(port)
        name = f"wire-{cap}-{workers}-{secrets.token_hex(3)}"
        server = server_add(name=name, url=f"http://127.0.0.1:{port}/mcp", max_qps=cap)
        qps_bucket().reset(key=server_bucket_key(server_id=server.pk))
        qps_bucket().spend(key=server_bucket_key(server_id=server.pk))  # negotiation just left
        for i in range(ops):
            operation_submit(server_name=name, tool_name="sleep_then_complete",
                             call_node_id=f"{name}/{i}", arguments={"seconds": 2, "value": str(i)})
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for w in range(workers):
            procs.append(_spawn([sys.executable, "manage.py", "toolops", "run", "--until-idle",
                                 "--max-seconds", str(seconds)], tmp / f"worker-{w}.out", env))
        for proc in procs:
            proc.wait(timeout=seconds + 60)
        time.sleep(0.3)  # the proxy's last lines
    finally:
        for proc in procs:
            _stop(proc)
        _stop(proxy)
    arrivals = [line.split() for line in log.read_text().splitlines() if line.strip()]
    times = [float(t) for t, _ in arrivals]
    stats = qps_bucket().stats(key=server_bucket_key(server_id=server.pk))
    accepted = Operation.objects.filter(server=server, state=State.ACCEPTED).count()
    return {
        "cap": cap, "workers": workers, "ops": ops, "accepted": accepted,
        "requests_at_server": len(times),
        "peak_arrivals_in_any_sliding_second": peak_in_sliding_second(times),
        "bucket_peak_grants_in_a_calendar_second": stats.peak_in_one_second,
        "bucket_requests_after_server_add": stats.total,
        "grants_abandoned_past_send_deadline": stats.abandoned,
        "refused_tokens": stats.denied,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd")
    proxy = sub.add_parser("proxy")
    proxy.add_argument("--port", type=int, required=True)
    proxy.add_argument("--upstream", required=True)
    proxy.add_argument("--log", required=True)
    parser.add_argument("--caps", default="3,20")
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--ops", type=int, default=0, help="calls per run (default: 4 x cap)")
    parser.add_argument("--seconds", type=float, default=12.0, help="worker run time per run")
    args = parser.parse_args()
    if args.cmd == "proxy":
        proxy_main(port=args.port, upstream=args.upstream, log=args.log)
        return

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("TOOLOPS_QPS_NAMESPACE", f"qps-wire-{secrets.token_hex(4)}")
    # The SDK server and the counting proxy listen on loopback, which the URL policy refuses
    # unless the allow-list names it.
    os.environ.setdefault("TOOLOPS_SERVER_HOSTS", "public,127.0.0.0/8,::1")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    tmp = REPO / "var" / "qps_wire"
    tmp.mkdir(parents=True, exist_ok=True)
    peer_port = _free_port()
    # The server suggests 100 ms polls: the workers want far more than any cap allows.
    peer = _spawn([sys.executable, "-m", "tests.peers.mcp_server", "--port", str(peer_port),
                   "--poll-interval-ms", "100"], tmp / "peer.out")
    rows = []
    try:
        _wait_port(peer_port)
        for cap in [float(c) for c in args.caps.split(",")]:
            for workers in [int(w) for w in args.workers.split(",")]:
                row = measure(cap=cap, workers=workers, ops=args.ops or int(4 * cap),
                              seconds=args.seconds, upstream=f"http://127.0.0.1:{peer_port}",
                              tmp=tmp)
                row["verdict"] = "ok" if row["peak_arrivals_in_any_sliding_second"] <= cap else "OVER"
                rows.append(row)
                print(f"cap {cap:>4g}  workers {workers}  requests at server "
                      f"{row['requests_at_server']:>4}  peak in any sliding second "
                      f"{row['peak_arrivals_in_any_sliding_second']:>3} / {cap:g}  "
                      f"(bucket: peak {row['bucket_peak_grants_in_a_calendar_second']} per calendar "
                      f"second, abandoned {row['grants_abandoned_past_send_deadline']}, "
                      f"accepted {row['accepted']}/{row['ops']})  {row['verdict']}", flush=True)
    finally:
        _stop(peer)
    print(json.dumps({"runs": rows, "all_at_or_under_cap": all(r["verdict"] == "ok" for r in rows)}))


if __name__ == "__main__":
    main()
