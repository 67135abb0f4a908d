"""Benchmark (not a test): a worker process's polls against a server far away, with the adaptive
gate on its polls in flight against a fixed one.

A saturated machine is where the gate keeps one poll in flight per process (the perf harness's
bursts show it); this is the other side: a server whose every request waits `--delay-ms` on the
network, polled from an otherwise idle machine. There the polls should overlap: the gate should
climb to TOOLOPS_POLL_THREADS and the batches take about as long as with every thread running,
not as long as with one.

The delay is a TCP proxy in this process, in front of any MCP 2025-11-25 task server (the perf
harness's fast server is the usual one), holding each chunk the client sends for `--delay-ms`
before forwarding it. For each mode the benchmark submits `--calls` calls through the public API,
waits until their tasks are done, claims them all, and polls them as a worker would: batches of
TOOLOPS_POLL_BATCH_SIZE through `operations_poll_batch` (the poll threads and the gate), one
batch after the other. It prints the wall time, polls per second and the gate's final limit.

    FAST_TASK_SECONDS=1 FAST_POLL_MS=500 python ../shared/perf/fastserver.py --port 8765 &
    DATABASE_URL=postgres://root@127.0.0.1:5432/toolops_bench TOOLOPS_SERVER_HOSTS=public,127.0.0.0/8 \
        .venv/bin/python manage.py migrate -v0
    DATABASE_URL=... TOOLOPS_SERVER_HOSTS=... .venv/bin/python benchmarks/poll_concurrency.py \
        --url http://127.0.0.1:8765/mcp --delay-ms 50 --calls 96
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

from ledger.models import TerminalReceipt  # noqa: E402
from toolops import api  # noqa: E402
from toolops.services import poll_batch  # noqa: E402
from toolops.services.dispatch import operations_claim_due  # noqa: E402
from toolops.services.servers import server_add  # noqa: E402


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def delay_proxy_start(*, upstream: tuple[str, int], delay_s: float) -> int:
    """A TCP proxy on a free local port, in a daemon thread: what the client sends reaches
    `upstream` `delay_s` later; the answers come back at once. Returns its port."""
    port = _free_port()
    ready = threading.Event()

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
        try:
            while chunk := await reader.read(65536):
                if delay:
                    await asyncio.sleep(delay)
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(*upstream)
        await asyncio.gather(pump(client_r, up_w, delay_s), pump(up_r, client_w, 0.0))

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        ready.set()
        async with server:
            await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(main()), daemon=True).start()
    ready.wait(5.0)
    return port


def run_mode(*, name: str, server_name: str, calls: int, task_s: float, adaptive: bool,
             threads: int) -> dict[str, float]:
    tag = uuid.uuid4().hex[:8]
    for i in range(calls):
        node = f"pc-{tag}-{i}"
        api.submit_call(server=server_name, tool="work", call_node_id=node,
                        arguments={"call_id": node}, idempotency_key=node)
    time.sleep(task_s + 0.2)  # every task done at the server: each row settles in one poll
    owner = f"bench-{tag}"
    ids = operations_claim_due(owner=owner, limit=calls)
    size = int(settings.TOOLOPS_POLL_BATCH_SIZE)
    with override_settings(TOOLOPS_POLL_ADAPTIVE=adaptive, TOOLOPS_POLL_THREADS=threads):
        poll_batch.poll_threads_stop()  # the next batch starts threads and gate anew
        started = time.monotonic()
        for k in range(0, len(ids), size):
            poll_batch.operations_poll_batch(operation_ids=ids[k:k + size], lease_owner=owner)
        wall = time.monotonic() - started
        gate = poll_batch._threads._gate if poll_batch._threads is not None else None
        limit = gate.limit if gate is not None else 0
        poll_batch.poll_threads_stop()
    accepted = TerminalReceipt.objects.filter(operation_id__in=ids).count()
    return {"mode": name, "rows": len(ids), "accepted": accepted, "wall_s": round(wall, 2),
            "rows_per_s": round(len(ids) / wall, 1), "final_limit": limit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8765/mcp")
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--calls", type=int, default=96)
    parser.add_argument("--task-seconds", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=int(settings.TOOLOPS_POLL_THREADS))
    args = parser.parse_args()
    url = httpx.URL(args.url)
    port = delay_proxy_start(upstream=(url.host, url.port or 80), delay_s=args.delay_ms / 1000)
    name = f"far-{uuid.uuid4().hex[:6]}"
    server_add(name=name, url=str(url.copy_with(host="127.0.0.1", port=port)), max_qps=100_000.0)
    modes = [("adaptive", True, args.threads), (f"fixed {args.threads}", False, args.threads),
             ("fixed 1", False, 1)]
    print(f"server {args.url} behind a {args.delay_ms:g} ms proxy; {args.calls} rows per mode, "
          f"batches of {settings.TOOLOPS_POLL_BATCH_SIZE}")
    print(f"{'mode':>10} {'rows':>5} {'accepted':>8} {'wall s':>7} {'rows/s':>7} {'final limit':>11}")
    for mode, adaptive, threads in modes:
        r = run_mode(name=mode, server_name=name, calls=args.calls, task_s=args.task_seconds,
                     adaptive=adaptive, threads=threads)
        print(f"{r['mode']:>10} {r['rows']:>5} {r['accepted']:>8} {r['wall_s']:>7} "
              f"{r['rows_per_s']:>7} {r['final_limit']:>11}")


if __name__ == "__main__":
    main()
