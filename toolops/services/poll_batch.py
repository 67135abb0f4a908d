"""Polling claimed rows in batches, concurrently, and holding rows whose next poll is near.

A batch (the ids one dispatcher claim leased to one owner) is polled on the process's poll
threads, each row inside the per-row error boundary (`operation_poll_guarded`), so a crash of
one row is recorded on that row and the others carry on. The batch's rows are read again from
the ledger in one statement before their polls start (the broker carries ids only); each poll
re-checks lease and epoch on that read, takes its QPS token through `server_call` and writes
through the guarded UPDATEs of the poll cycle; the threads only overlap the waits (server,
PostgreSQL, Redis). The adapter cache is per process, so all threads share one pooled HTTP
client per server.

Claimed ahead: the dispatcher may claim a free row shortly before it is due and say when it is
due (`not_before`); such a row goes to the holder with the batch's read of it and is polled at
that time, with no renewal (its claim's lease is fresh and full). While the fleet is behind, the
dispatcher sends every row's due time, and on a machine with no CPU to spare a row's first poll
waits in the holder the same way until one interval after it (`_first_polls_deferred`).

Holding: a working row whose next poll is due within TOOLOPS_POLL_HOLD_SECONDS keeps its lease
(written by the poll's own guarded UPDATE, with its `next_poll_at` as usual: the ledger stays the
source of truth) and the process's holder thread polls it again at that time, instead of
releasing it to the dispatcher tick and the broker. Before each held poll the holder renews the
lease with a guarded UPDATE that requires the lease to be still ours and unexpired and returns
the renewed rows with their servers (so those polls need no read of their own); the poll itself
re-checks the lease on that row and on every write. A renewal also takes the held rows falling
due within TOOLOPS_DISPATCH_AHEAD_SECONDS, each then polled at its own time with that read: held
rows due close together share one renewal, as claimed rows share one claim. If the process dies
or falls behind, the held lease ends TOOLOPS_POLL_HOLD_GRACE_SECONDS after the due time and the
dispatcher claims the row.

Threads and the database: each poll thread and the holder thread has its own Django connection
(Django keeps one per thread). Each thread runs `close_old_connections` (what Django does
around a request: a broken or too old connection is replaced, and with CONN_HEALTH_CHECKS the
next query is preceded by a health check, one commit) at most every
CONNECTION_CHECK_INTERVAL_SECONDS and after any failed row, not before every row: one check per
row would be one more commit per poll. Each thread closes its connections when it stops
(`poll_threads_stop`, called at worker process shutdown).
"""

from __future__ import annotations

import heapq
import logging
import threading
import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from datetime import datetime, timedelta
from functools import partial

from django.conf import settings
from django.db import connections
from django.utils import timezone

from ledger.models import Operation
from ledger.services.guarded import operations_leases_extend
from ledger.services.schedule import RELEASE, schedule_at
from ledger.states import POLLABLE, State
from toolops.metrics import poll_concurrency_gone, poll_concurrency_set
from toolops.services.boundary import operation_poll_guarded, operations_load_for_poll
from toolops.services.db_retry import exception_redacted
from toolops.services.poll_concurrency import machine_cpu_to_spare, poll_concurrency_new
from toolops.services.poll_threads import ConnectionCheck, PollThreads

logger = logging.getLogger("toolops.poll_batch")

# A row claimed ahead that is due sooner than this is polled at once: a hold that short costs a
# trip through the holder thread for nothing.
HOLD_AHEAD_MIN = timedelta(milliseconds=5)


# One row the holder keeps: when it is due, its id, its lease owner, and its read when its lease
# is already fresh (claimed ahead of its time, or renewed ahead with a held row due before it);
# None for a row held after its own poll, whose lease is renewed when it is due.
_Held = tuple[datetime, str, str, Operation | None]


class _Holder:
    """Rows this process keeps until they are due: rows held between polls (their lease renewed
    at the due time) and rows the dispatcher claimed ahead of their time (their fresh claim is
    the lease; their read from the claim's batch goes to the poll)."""

    def __init__(self, *, threads: PollThreads) -> None:
        self._threads = threads
        self._heap: list[_Held] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="toolops-poll-holder", daemon=True)
        self._thread.start()

    def size(self) -> int:
        with self._cond:
            return len(self._heap)

    def add(self, *, rows: Iterable[tuple[uuid.UUID, datetime]], owner: str) -> None:
        self._push([(due, str(op_id), owner, None) for op_id, due in rows])

    def add_claimed(self, *, rows: Iterable[tuple[uuid.UUID, datetime, Operation]],
                    owner: str) -> None:
        """Rows claimed before they are due, each with its read."""
        self._push([(due, str(op_id), owner, row) for op_id, due, row in rows])

    def _push(self, entries: list[_Held]) -> None:
        with self._cond:
            for entry in entries:
                heapq.heappush(self._heap, entry)  # ids are unique here: no tie reaches the row
            self._cond.notify()

    def _take_due(self) -> list[_Held] | None:
        with self._cond:
            while not self._stopping:
                if self._heap:
                    wait = (self._heap[0][0] - timezone.now()).total_seconds()
                    if wait <= 0:
                        return self._pop_due(now=timezone.now())
                    self._cond.wait(timeout=wait)
                else:
                    self._cond.wait()
            return None

    def _pop_due(self, *, now: datetime) -> list[_Held]:
        """The entries due at `now`; with a renewal among them, also the held rows due within
        the dispatcher's horizon (TOOLOPS_DISPATCH_AHEAD_SECONDS), renewed by the same statement
        and polled at their own times: held rows falling due close together share one renewal,
        as claimed rows share one claim. The caller holds the lock."""
        due = []
        while self._heap and self._heap[0][0] <= now:
            due.append(heapq.heappop(self._heap))
        if any(row is None for _at, _key, _owner, row in due):
            horizon = now + timedelta(seconds=float(settings.TOOLOPS_DISPATCH_AHEAD_SECONDS))
            soon = [entry for entry in self._heap if entry[3] is None and entry[0] <= horizon]
            if soon:
                self._heap = [entry for entry in self._heap
                              if not (entry[3] is None and entry[0] <= horizon)]
                heapq.heapify(self._heap)
                due.extend(soon)
        return due

    def _renewed_soon(self, *, due: list[_Held], owner: str,
                      renewed: dict[uuid.UUID, Operation]) -> list[uuid.UUID]:
        """Of a renewal round's rows, those due now; the renewed rows due later go back to the
        heap with their read (their lease is fresh, so no second renewal at their time)."""
        now = timezone.now()
        polled_now: list[uuid.UUID] = []
        later: list[_Held] = []
        for at, key, entry_owner, row in due:
            if row is not None or entry_owner != owner:
                continue
            op_id = uuid.UUID(key)
            if at <= now:
                polled_now.append(op_id)
            elif op_id in renewed:
                later.append((at, key, owner, renewed[op_id]))
            else:
                later.append((at, key, owner, None))  # polled at its time, and refused then
        if later:
            self._push(later)
        return polled_now

    def _run(self) -> None:
        check = ConnectionCheck()
        failed = False
        try:
            while True:
                due = self._take_due()
                if due is None:
                    return
                by_owner: dict[str, list[uuid.UUID]] = {}
                claimed: dict[str, dict[uuid.UUID, Operation]] = {}
                for _at, key, owner, row in due:
                    if row is None:
                        by_owner.setdefault(owner, []).append(uuid.UUID(key))
                    else:
                        claimed.setdefault(owner, {})[uuid.UUID(key)] = row
                for owner, rows in claimed.items():
                    # Claimed or renewed moments ago, a full lease: nothing to renew before the poll.
                    self._hand_over(ids=list(rows), owner=owner, loaded=rows)
                for owner, ids in by_owner.items():
                    try:
                        check(failed=failed)
                        failed = False
                        # The renewed rows come back read: their polls need no read of their own.
                        renewed = operations_hold_renew(ids=ids, owner=owner)
                    except Exception as exc:
                        failed = True
                        # The rows keep their held leases, which run out; the dispatcher re-claims.
                        logger.warning("held leases not renewed: %s", exception_redacted(exc)["type"])
                        continue
                    now_ids = self._renewed_soon(due=due, owner=owner, renewed=renewed)
                    if now_ids:
                        self._hand_over(ids=now_ids, owner=owner, loaded=renewed)
        finally:
            connections.close_all()

    def _hand_over(self, *, ids: list[uuid.UUID], owner: str,
                   loaded: dict[uuid.UUID, Operation]) -> None:
        """Poll these rows now, with their reads. Not waited for: the next due rows must not
        queue behind this round's polls. Its own threads, never _pool(): while stopping, that
        would start anew."""
        for row_id, future in _submit_rows(threads=self._threads, holder=self, operation_ids=ids,
                                           lease_owner=owner, loaded=loaded):
            future.add_done_callback(partial(self._settled, row_id, owner))

    def _settled(self, op_id: uuid.UUID, owner: str, future: Future[str]) -> None:
        if future.exception() is None:
            _hold_if_held(holder=self, op_id=op_id, outcome=future.result(), owner=owner)

    def stop(self) -> None:
        """Stop scheduling held polls (polls already handed to the threads still run)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout=5.0)

    def drain(self) -> list[_Held]:
        with self._cond:
            left, self._heap = self._heap, []
        return left


_lock = threading.Lock()
_threads: PollThreads | None = None
_holder: _Holder | None = None


def _pool() -> tuple[PollThreads, _Holder]:
    """This process's poll threads and holder, started on first use (after a prefork fork)."""
    global _threads, _holder
    with _lock:
        if _threads is None or _holder is None:
            size = int(settings.TOOLOPS_POLL_THREADS)
            gate = poll_concurrency_new(most=size, adaptive=bool(settings.TOOLOPS_POLL_ADAPTIVE),
                                        on_limit=lambda limit: poll_concurrency_set(limit=limit))
            _threads = PollThreads(size=size, gate=gate)
            _holder = _Holder(threads=_threads)
        return _threads, _holder


def operations_hold_renew(*, ids: list[uuid.UUID], owner: str) -> dict[uuid.UUID, Operation]:
    """Extend the held leases of rows now due, as a claim would (a full lease, one more poll
    attempt), but only where the lease is still ours and unexpired; returns the renewed rows as
    read after the write. A row that fails this check is absent: its poll reads it and refuses it
    (`stale_lease`), and the dispatcher owns it again."""
    now = timezone.now()
    return operations_leases_extend(
        ids=ids, owner=owner, now=now, states=POLLABLE,
        until=now + timedelta(seconds=float(settings.TOOLOPS_LEASE_SECONDS)),
        defer_flush=bool(settings.TOOLOPS_DEFERRED_FLUSH))


def operations_poll_batch(*, operation_ids: list[uuid.UUID], lease_owner: str,
                          not_before: Mapping[uuid.UUID, datetime] | None = None,
                          ) -> dict[str, int]:
    """Poll each row of a batch leased to `lease_owner` concurrently, each inside the per-row
    error boundary; keep the working rows whose next poll is near. Returns outcome counts.

    `not_before`: the rows' due times, as the dispatcher's claim found them. Rows still ahead
    (claimed before their time) go to the holder with their read and are polled when due
    (counted as `ahead`). Rows due already are polled now, except, on a machine with no CPU to
    spare, a row's first poll, which is put off by one interval (counted as `deferred`,
    `_first_polls_deferred`)."""
    if not operation_ids:
        return {}
    threads, holder = _pool()
    now, batch = timezone.now(), set(operation_ids)
    due = {op_id: at for op_id, at in (not_before or {}).items() if op_id in batch}
    ahead = {op_id: at for op_id, at in due.items() if at - now > HOLD_AHEAD_MIN}
    busy = (len(ahead) < len(due) and bool(settings.TOOLOPS_POLL_DEFER_FIRST_WHEN_BUSY)
            and holder.size() < int(settings.TOOLOPS_POLL_HOLD_MAX_ROWS)
            and not machine_cpu_to_spare())
    if not ahead and not busy:
        return _poll_rows(threads=threads, holder=holder, operation_ids=operation_ids,
                          lease_owner=lease_owner)
    loaded = operations_load_for_poll(operation_ids=operation_ids)
    # A row the read missed is polled now: its poll reads it and judges it like any other.
    early = {op_id: at for op_id, at in ahead.items() if op_id in loaded}
    deferred = _first_polls_deferred(
        due={op_id: at for op_id, at in due.items() if op_id not in ahead},
        loaded=loaded, now=now) if busy else {}
    later = {**early, **deferred}
    holder.add_claimed(rows=[(op_id, at, loaded[op_id]) for op_id, at in later.items()],
                       owner=lease_owner)
    counts = _poll_rows(threads=threads, holder=holder, lease_owner=lease_owner, loaded=loaded,
                        operation_ids=[op_id for op_id in operation_ids if op_id not in later])
    if ahead:
        counts["ahead"] = len(early)
    if deferred:
        counts["deferred"] = len(deferred)
    return counts


def _first_polls_deferred(*, due: Mapping[uuid.UUID, datetime], loaded: Mapping[uuid.UUID, Operation],
                          now: datetime) -> dict[uuid.UUID, datetime]:
    """Of the rows due already (`due`), those whose poll would be their first answer since the
    submit's reply, each with its due time plus one interval: the time the poll after it would
    have come.

    On a saturated machine every poll costs another call's CPU, and the first poll of a row is
    the one most often answered "working" (a task rarely ends within one suggested interval), so
    it is skipped; the server's interval is a floor, never a promise to poll that soon. Such a
    row waits in the holder under its claim's fresh lease, so the wait is capped at half a lease,
    and never reaches the row's expiry. Only a WORKING row claimed once, never yet answered
    "working", qualifies: a row retried, cancelled, asked for input or back from a lapsed lease
    is polled at its time."""
    cap = timedelta(seconds=float(settings.TOOLOPS_LEASE_SECONDS) / 2)
    deferred = {}
    for op_id, at in due.items():
        row = loaded.get(op_id)
        if (row is None or row.state != State.WORKING or row.polls_count or row.poll_attempts > 1
                or not row.poll_interval_ms):
            continue
        until = at + timedelta(milliseconds=row.poll_interval_ms)
        if (HOLD_AHEAD_MIN < until - now <= cap
                and (row.expires_at is None or until < row.expires_at)):
            deferred[op_id] = until
    return deferred


def _poll_rows(*, threads: PollThreads, holder: _Holder, operation_ids: list[uuid.UUID],
               lease_owner: str, loaded: dict[uuid.UUID, Operation] | None = None,
               ) -> dict[str, int]:
    counts: dict[str, int] = {}
    if not operation_ids:
        return counts
    for op_id, future in _submit_rows(threads=threads, holder=holder, loaded=loaded,
                                      operation_ids=operation_ids, lease_owner=lease_owner):
        outcome = future.result()
        label = outcome.partition(":")[0]
        counts[label] = counts.get(label, 0) + 1
        _hold_if_held(holder=holder, op_id=op_id, outcome=outcome, owner=lease_owner)
    return counts


def _submit_rows(*, threads: PollThreads, holder: _Holder, operation_ids: list[uuid.UUID],
                 lease_owner: str, loaded: dict[uuid.UUID, Operation] | None = None,
                 ) -> list[tuple[uuid.UUID, Future[str]]]:
    """Hand each row to the poll threads, inside the per-row error boundary. `loaded`: rows
    already read (the held rows' renewal returns them); otherwise the batch is read here."""
    hold_seconds = float(settings.TOOLOPS_POLL_HOLD_SECONDS)
    hold_until = None
    if hold_seconds > 0 and holder.size() < int(settings.TOOLOPS_POLL_HOLD_MAX_ROWS):
        hold_until = timezone.now() + timedelta(seconds=hold_seconds)
    # The batch's rows are read here in one statement, not by each poll (one round trip per
    # batch instead of per row); a row missing from the read is read by its own poll.
    if loaded is None:
        loaded = operations_load_for_poll(operation_ids=operation_ids)
    return [(op_id, threads.submit(partial(operation_poll_guarded, operation_id=op_id,
                                           lease_owner=lease_owner, hold_until=hold_until,
                                           loaded=loaded.get(op_id))))
            for op_id in operation_ids]


def _hold_if_held(*, holder: _Holder, op_id: uuid.UUID, outcome: str, owner: str) -> None:
    label, _, detail = outcome.partition(":")
    if label == "held":
        # The poll kept the lease and wrote this next poll time (observe._record_working).
        holder.add(rows=[(op_id, datetime.fromisoformat(detail))], owner=owner)


def operations_release_held(*, rows: list[_Held]) -> int:
    """Hand back held leases (this process stops). A row held after its poll stays due at the
    next poll time that poll wrote; a row held with a fresh lease (claimed ahead, whose claim
    moved that time to the lease's end, or renewed ahead) becomes due now, at most one
    dispatcher horizon early."""
    released = 0
    held: dict[str, list[str]] = {}
    ahead: dict[str, list[str]] = {}
    for _at, op_id, owner, row in rows:
        (held if row is None else ahead).setdefault(owner, []).append(op_id)
    now = timezone.now()
    for owner, ids in held.items():
        released += Operation.objects.filter(id__in=ids, lease_owner=owner).update(
            **RELEASE, updated_at=now)
    for owner, ids in ahead.items():
        released += Operation.objects.filter(id__in=ids, lease_owner=owner).update(
            **schedule_at(at=now), updated_at=now)
    return released


def poll_threads_stop() -> int:
    """Stop this process's holder and poll threads (their connections are closed) and hand back
    the held rows. Returns how many leases were handed back."""
    global _threads, _holder
    with _lock:
        threads, holder = _threads, _holder
        _threads = _holder = None
    if holder is None or threads is None:
        return 0
    holder.stop()
    threads.stop()  # runs what was handed to the threads; held ones come back to the holder
    # After the threads: their last releases may still move the limit, and report it.
    poll_concurrency_gone()
    left = holder.drain()
    try:
        return operations_release_held(rows=left)
    except Exception as exc:  # the held leases run out on their own
        logger.warning("held rows not handed back: %s", exception_redacted(exc)["type"])
        return 0
