"""How many polls one worker process runs at once: an adaptive limit between 1 and its poll threads.

A poll thread mostly waits: on the server, on PostgreSQL, on Redis. While the machine has idle
CPU, more polls in flight overlap those waits and each row is polled at its time. Once the CPU is
saturated, more polls in flight add no throughput: they only let the worker poll every row the
moment it falls due, and under a burst most of those polls are answered "working", CPU taken
from the calls still being submitted and settled. Polled a little later, a row is more often
found finished, in one poll instead of two. Measured with the perf harness (toolops-only bursts
of 5,000 one-second calls, alternating, one machine): one poll in flight per process made 245 to
265 calls/s at 7.2 to 7.7 ms of box CPU per call and 1.25 to 1.34 polls per call; two made 198
to 220 calls/s at 8.8 to 9.8 ms and 1.51 to 1.64 polls, at the same median latency (in later
series of this gate against two threads the polls saved held in every pair, the calls/s gained
did not rise above the machine's drift). Paced at 20 calls/s both polled on time (p99 1.07 s for
1 s tasks). No fixed number suits both a fleet polling servers far away (many polls in flight,
each waiting on the network) and one whose machine is saturated, so the limit follows the CPU to
spare.

The control is additive increase, additive decrease, evaluated at most every EVAL_SECONDS by a
thread that takes or gives back a slot, from two readings since the last evaluation:

- the machine's idle CPU, from /proc/stat (idle and iowait over all time counters);
- this process's own CPU time over the wall time (`time.process_time`): a process whose threads
  already keep one core busy gains nothing from another thread, whose Python code waits for the
  same interpreter lock, however idle the machine's other cores are.

The machine is saturated with less than IDLE_LOW of its CPU idle, or with the process busy more
than BUSY_HIGH of one core: the limit goes down by one (not below 1). There is CPU to spare with
more than IDLE_HIGH idle and the process busy less than BUSY_LOW: the limit goes up by one (not
above the threads), but only if a row waited for a slot since the last evaluation (a limit
nothing asked for is not raised). Between the two it stays. It starts at one.

The machine's reading is the whole machine's: in a container whose CPU quota is below the
machine's cores, a saturated quota shows in the process's own reading only if this process is
what fills it. Where /proc/stat cannot be read (not Linux), the process's own reading decides.
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
# Above this share of one core used by the process itself, another poll thread would only wait
# for the interpreter lock; below the lower one, the process has room for one more.
BUSY_HIGH = 0.85
BUSY_LOW = 0.60
# The limit moves by at most one per this many seconds: a burst that starts takes the limit from
# four to one within a second, and each step's effect shows in the next reading.
EVAL_SECONDS = 0.25

_PROC_STAT = "/proc/stat"


def _share_since(sample: Callable[[], tuple[float, float]]) -> Callable[[], float | None]:
    """A function returning, since its previous call, how much the first of `sample`'s two
    running totals grew over how much the second grew (None when the second did not)."""
    last = [sample()]

    def share() -> float | None:
        part, whole = sample()
        part0, whole0 = last[0]
        last[0] = (part, whole)
        if whole <= whole0:
            return None
        return (part - part0) / (whole - whole0)

    return share


def cpu_idle_reader(path: str = _PROC_STAT) -> Callable[[], float | None] | None:
    """A function returning the machine's idle CPU share since its previous call (None when
    nothing elapsed), or None where `path` cannot be read."""

    def counters() -> tuple[float, float]:
        with open(path, encoding="ascii") as stat:
            fields = stat.readline().split()
        # cpu user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is
        # already counted in user, so the total stops at steal.
        values = [int(v) for v in fields[1:9]]
        return values[3] + values[4], sum(values)

    try:
        return _share_since(counters)
    except (OSError, ValueError, IndexError):
        return None


def process_busy_reader(*, clock: Callable[[], float] = time.monotonic,
                        cpu: Callable[[], float] = time.process_time) -> Callable[[], float | None]:
    """A function returning this process's CPU time over wall time since its previous call
    (1.0: one core kept busy), None when no time elapsed."""
    return _share_since(lambda: (cpu(), clock()))


class PollConcurrency:
    """A counting gate whose size follows the CPU to spare (see the module docstring).

    `acquire` blocks while `limit` slots are held; `release` gives one back; `open` lets every
    waiter through for good (the threads are stopping). `idle`: the machine's idle-share reader;
    `busy`: the process's own; with neither, the limit is fixed at `most`.
    """

    def __init__(self, *, most: int, idle: Callable[[], float | None] | None,
                 busy: Callable[[], float | None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_limit: Callable[[int], None] | None = None) -> None:
        self.most = max(int(most), 1)
        self._idle = idle
        self._busy = busy
        self._clock = clock
        self._on_limit = on_limit
        self._cond = threading.Condition()
        self._held = 0
        self._limit = 1 if idle is not None or busy is not None else self.most
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
        if self._idle is None and self._busy is None:
            return
        now = self._clock()
        if now - self._evaluated < EVAL_SECONDS:
            return
        self._evaluated = now
        idle = _reading(self._idle)
        busy = _reading(self._busy)
        if idle is not None or busy is not None:
            saturated = ((idle is not None and idle < IDLE_LOW)
                         or (busy is not None and busy > BUSY_HIGH))
            spare = ((idle is None or idle > IDLE_HIGH)
                     and (busy is None or busy < BUSY_LOW))
            if saturated and self._limit > 1:
                self._limit -= 1
                self._report()
            elif spare and self._wanted and self._limit < self.most:
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


def _reading(read: Callable[[], float | None] | None) -> float | None:
    if read is None:
        return None
    try:
        return read()
    except (OSError, ValueError, IndexError):
        return None  # an unreadable moment changes nothing


def poll_concurrency_new(*, most: int, adaptive: bool,
                         on_limit: Callable[[int], None] | None = None) -> PollConcurrency:
    """The gate for a process's `most` poll threads, adaptive or fixed at `most`. `on_limit` is
    told the limit at the start and at every change (the metric)."""
    if not adaptive:
        return PollConcurrency(most=most, idle=None, on_limit=on_limit)
    return PollConcurrency(most=most, idle=cpu_idle_reader(), busy=process_busy_reader(),
                           on_limit=on_limit)


class CpuToSpare:
    """Whether the machine has CPU to spare: more than IDLE_HIGH of it idle over the last reading
    window (at least EVAL_SECONDS; asked more often, the last verdict stands). The dispatcher asks
    it before claiming rows ahead of their time, which pays on a machine with CPU to spare (one
    claim and one message for several rows) and costs on a saturated one (rows polled on time
    instead of late are more often found still working). Where the machine's CPU cannot be read,
    the answer is yes."""

    def __init__(self, *, idle: Callable[[], float | None] | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._idle = idle
        self._clock = clock
        self._lock = threading.Lock()
        self._at = clock()
        self._spare = True

    def __call__(self) -> bool:
        if self._idle is None:
            return True
        with self._lock:
            now = self._clock()
            if now - self._at >= EVAL_SECONDS:
                idle = _reading(self._idle)
                if idle is not None:
                    self._spare = idle > IDLE_HIGH
                self._at = now
            return self._spare


_spare_lock = threading.Lock()
_spare: CpuToSpare | None = None


def machine_cpu_to_spare() -> bool:
    """This process's CpuToSpare on the machine's /proc/stat, made on first use (after a fork)."""
    global _spare
    with _spare_lock:
        if _spare is None:
            _spare = CpuToSpare(idle=cpu_idle_reader())
        spare = _spare
    return spare()
