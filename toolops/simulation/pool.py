"""Worker threads for the simulation's polls (toolops.simulation.runner)."""

from __future__ import annotations

import queue
import threading
import uuid
from typing import Any

from django import db


class PollPool:
    """Worker threads for one tick's claimed rows (each thread has its own DB connection).

    With more than one worker, rows polled in the same tick run concurrently, as in a fleet: the
    order inside a tick is then the scheduler's, not the seed's, so a full run is reproducible in
    its plans and verdicts but not call for call; `--only` (one series) is always sequential.
    """

    def __init__(self, *, workers: int, fn: Any) -> None:
        self.fn = fn
        self.jobs: queue.Queue[uuid.UUID | None] = queue.Queue()
        self.threads = [threading.Thread(target=self._work, daemon=True, name=f"sim-worker-{n}")
                        for n in range(workers)]
        for t in self.threads:
            t.start()

    def _work(self) -> None:
        try:
            while (op_id := self.jobs.get()) is not None:
                try:
                    self.fn(op_id)
                finally:
                    self.jobs.task_done()
            self.jobs.task_done()
        finally:
            db.connection.close()

    def run(self, ids: list[uuid.UUID]) -> None:
        for op_id in ids:
            self.jobs.put(op_id)
        self.jobs.join()

    def close(self) -> None:
        for _ in self.threads:
            self.jobs.put(None)
        for t in self.threads:
            t.join()
