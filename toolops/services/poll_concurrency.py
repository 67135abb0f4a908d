"""How many polls one worker process runs at once: an adaptive limit between 1 and its poll threads.

A poll thread mostly waits: on the server, on PostgreSQL, on Redis. While the machine has idle
CPU, more polls in flight overlap those waits and each row is polled at its time. Once the CPU is
saturated, more polls in flight add no throughput: they only let the worker poll every row the
moment it falls due, and under a burst most of those polls are answered "working", CPU taken
from the calls still being submitted and settled. Polled a little later, a row is more often
found finished, in one poll instead of two. Measured with the perf harness (toolops-only bursts
of 5,000 one-second calls, alternating, one machine): one poll in flight per process made 245 to
265 calls/s at 7.2 to 7.7 ms of box CPU per call and 1.25 to 1.34 polls per call; two made 198
to 220 calls/s at 8.8 to 9.8 ms and 1.51 to 1.64 polls, at the same median latency. Paced at 20
calls/s both polled on time (p99 1.07 s for 1 s tasks). No fixed number suits both a fleet
polling servers far away (many polls in flight, each waiting on the network) and one whose
machine is saturated, so the limit follows the machine's idle CPU.

The control is additive increase, additive decrease, evaluated at most every EVAL_SECONDS by a
thread that takes or gives back a slot: with less than IDLE_LOW of the machine's CPU idle since
the last evaluation, the limit goes down by one (not below 1); with more than IDLE_HIGH idle, it
goes up by one (not above the threads), but only if a row waited for a slot since the last
evaluation: a limit nothing asked for is not raised. Between the two it stays. It starts at one.

Idle CPU is read from /proc/stat (idle and iowait over all time counters), the whole machine's:
a worker in a container with a CPU quota below the machine's cores sees its quota's saturation
only through the other signal a saturated worker gives, its polls coming late. Where /proc/stat
cannot be read (not Linux), the limit is the number of threads, as with TOOLOPS_POLL_ADAPTIVE off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# Below this share of idle CPU the machine is saturated: one poll fewer in flight per process.
# Ten percent, not zero: a burst leaves a few percent idle in the gaps between its waits.
IDLE_LOW = 0.10
# Above this share, one poll more in flight costs CPU the machine has to spare. The gap between
# the two keeps the limit from flapping on a machine that sits near one threshold.
IDLE_HIGH = 0.25
# The limit moves by at most one per this many seconds: a burst that starts takes the limit from
# four to one within a second, and each step's effect shows in the next reading.
EVAL_SECONDS = 0.25

_PROC_STAT = "/proc/stat"


def cpu_idle_reader(path: str = _PROC_STAT) -> Callable[[], float | None] | None:
    """A function returning the machine's idle CPU share since its previous call (None on its
    first call or when nothing elapsed), or None where `path` cannot be read."""

    def counters() -> tuple[int, int]:
        with open(path, encoding="ascii") as stat:
            fields = stat.readline().split()
        # cpu user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is
        # already counted in user, so the total stops at steal.
        values = [int(v) for v in fields[1:9]]
        return values[3] + values[4], sum(values)

    try:
        last = [counters()]
    except (OSError, ValueError, IndexError):
        return None

    def idle_share() -> float | None:
        idle, total = counters()
        idle0, total0 = last[0]
        last[0] = (idle, total)
        if total <= total0:
            return None
        return (idle - idle0) / (total - total0)

    return idle_share


class PollConcurrency:
    """A counting gate whose size follows the machine's idle CPU (see the module docstring).

    `acquire` blocks while `limit` slots are held; `release` gives one back; `open` lets every
    waiter through for good (the threads are stopping). `idle`: the idle-share reader, None for
    a fixed limit of `most`.
    """

    def __init__(self, *, most: int, idle: Callable[[], float | None] | None,
                 clock: Callable[[], float] = time.monotonic,
                 on_limit: Callable[[int], None] | None = None) -> None:
        self.most = max(int(most), 1)
        self._idle = idle
        self._clock = clock
        self._on_limit = on_limit
        self._cond = threading.Condition()
        self._held = 0
        self._limit = 1 if idle is not None else self.most
        self._open = False
        self._wanted = False  # a row waited for a slot since the last evaluation
        self._evaluated = clock()
        self._report()

    @property
    def limit(self) -> int:
        return self._limit

    def acquire(self) -> None:
        with self._cond:
            self._evaluate()
            while self._held >= self._limit and not self._open:
                self._wanted = True
                self._cond.wait(timeout=EVAL_SECONDS)
                self._evaluate()
            self._held += 1

    def release(self) -> None:
        with self._cond:
            self._held -= 1
            self._evaluate()
            self._cond.notify()

    def open(self) -> None:
        with self._cond:
            self._open = True
            self._cond.notify_all()

    def _evaluate(self) -> None:
        """Called with the condition held."""
        if self._idle is None:
            return
        now = self._clock()
        if now - self._evaluated < EVAL_SECONDS:
            return
        self._evaluated = now
        try:
            idle = self._idle()
        except (OSError, ValueError, IndexError):
            idle = None  # an unreadable moment changes nothing
        if idle is not None:
            if idle < IDLE_LOW and self._limit > 1:
                self._limit -= 1
                self._report()
            elif idle > IDLE_HIGH and self._wanted and self._limit < self.most:
                self._limit += 1
                self._report()
                self._cond.notify()
        self._wanted = False

    def _report(self) -> None:
        if self._on_limit is not None:
            try:
                self._on_limit(self._limit)
            except Exception:  # a metric that cannot be written never stops a poll
                pass


def poll_concurrency_new(*, most: int, adaptive: bool,
                         on_limit: Callable[[int], None] | None = None) -> PollConcurrency:
    """The gate for a process's `most` poll threads: adaptive where idle CPU can be read.
    `on_limit` is told the limit at the start and at every change (the metric)."""
    return PollConcurrency(most=most, idle=cpu_idle_reader() if adaptive else None,
                           on_limit=on_limit)
