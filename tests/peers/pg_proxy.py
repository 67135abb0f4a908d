"""A TCP forwarder in front of PostgreSQL that a test can cut, so the shared server never restarts.

Every client connection gets two pump threads (client to server, server to client). `cut(s)`
drops every open connection at once (both sockets shut down: each client sees the server close
the connection, exactly as on a PostgreSQL restart) and, for `s` seconds, accepts new
connections only to close them at once (a client sees its connection attempt fail).

`cut_on(pattern, seconds)` aims a cut: the next client message containing `pattern` (a piece of
SQL text as the driver sends it, e.g. `INSERT INTO "ledger_terminalreceipt"`) is not forwarded;
the proxy cuts instead, so the database never sees that statement and the transaction around it
dies with the connection. Each armed pattern fires once per entry of `seconds` (one cut each),
letting `skip` matches pass between two firings (a retried statement matches again: skipping
moves the next cut on to another row's write).
Importable without Django.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field

CHUNK = 65536


@dataclass
class _Aim:
    pattern: bytes
    durations: deque[float]
    skip: int = 0
    passed: int = 0
    fired: list[float] = field(default_factory=list)


class PgProxy:
    def __init__(self, upstream_host: str = "127.0.0.1", upstream_port: int = 5432) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._refuse_until = 0.0
        self._aims: list[_Aim] = []
        self._closed = threading.Event()
        self.connections = 0
        self.refused = 0
        self.cuts: list[tuple[float, float, str]] = []  # (monotonic time, seconds, why)
        self._thread = threading.Thread(target=self._accept_loop, name="pg-proxy", daemon=True)
        self._thread.start()

    # -- control -----------------------------------------------------------------------------

    def cut(self, seconds: float, why: str = "manual") -> int:
        """Drop every connection now and refuse new ones for `seconds`. Returns how many dropped."""
        with self._lock:
            self._refuse_until = max(self._refuse_until, time.monotonic() + seconds)
            pairs = list(self._pairs)
            self._pairs.clear()
            self.cuts.append((time.monotonic(), seconds, why))
        for a, b in pairs:
            for sock in (a, b):
                _shut(sock)
        return len(pairs)

    def cut_on(self, pattern: bytes, seconds: list[float], skip: int = 0) -> _Aim:
        aim = _Aim(pattern=pattern, durations=deque(seconds), skip=skip, passed=skip)
        with self._lock:
            self._aims.append(aim)
        return aim

    def refusing(self) -> bool:
        return time.monotonic() < self._refuse_until

    def close(self) -> None:
        self._closed.set()
        _shut(self._listener)
        self.cut(0.0, why="close")

    # -- plumbing ----------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refusing():
                self.refused += 1
                _shut(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                _shut(client)
                continue
            with self._lock:
                self._pairs.add((client, server))
                self.connections += 1
            pair = (client, server)
            threading.Thread(target=self._pump, args=(client, server, pair, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, pair, False),
                             daemon=True).start()

    def _aimed(self, tail: bytes, data: bytes) -> float | None:
        window = tail + data
        with self._lock:
            for aim in self._aims:
                if aim.durations and aim.pattern in window:
                    if aim.passed < aim.skip:
                        aim.passed += 1
                        continue
                    aim.passed = 0
                    seconds = aim.durations.popleft()
                    aim.fired.append(time.monotonic())
                    return seconds
        return None

    def _pump(self, src: socket.socket, dst: socket.socket,
              pair: tuple[socket.socket, socket.socket], from_client: bool) -> None:
        tail = b""
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                if from_client:
                    seconds = self._aimed(tail, data)
                    if seconds is not None:
                        self.cut(seconds, why="aimed")
                        return
                    tail = data[-256:]
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._pairs.discard(pair)
            _shut(src)
            _shut(dst)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
