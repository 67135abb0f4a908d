"""The simulation's ledger-side actors for three faults: epoch roll, forgotten task, operator.

- epoch_roll: while a tasks/get answer of the old epoch is in flight (SimServer calls back
  between building the answer and the adapter reading it), the row is handed to the other
  executor and back with the real rollout service (two `epoch_bumped` events, epoch + 2, lease
  revoked). The in-flight worker's write then carries an older epoch: it must be refused
  (`stale_epoch_refused`) and the row still ends in one receipt matching the ground truth.
- forget_before_ttl: the server forgets a finished task before its ttl, so polls get 404, the row
  is UNKNOWN and goes to the reconciliation queue. The operator below resolves it after a
  virtual delay with the real reconciliation service.
- foreign_task_id is server-side only (a tasks/get answer naming another server's task): the
  adapter refuses it as a protocol violation; the verdict's ground-truth check is the proof.
- expire_after_s (short ttl) is server-side too: the task ends and its ttl runs out soon after.
  A row that saw the terminal state and fetched in time is accepted as usual; one whose next poll
  comes after the expiry gets a 404 (or stops at its own copy of the expiry) with no receipt, is
  UNKNOWN, and goes to the queue, where the operator settles it.
- The operator settles a queue item from the server's console: the terminal status it shows is
  attested; a task it shows still running for a row that never learned its id (a lost create
  reply whose lookups ran out) gets that id attached, and the row polls on; no task at all is
  abandoned.

The operator's acceptance is an attestation, so its latency is kept out of the cancel
confirmation figure (the acceptance event says `settled_by: operator`; the gate lists them apart).
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import transaction

from ledger.errors import LedgerError
from ledger.models import Operation, OperationEvent, ReconciliationItem
from ledger.states import State, TerminalStatus
from toolops.errors import ToolopsError
from toolops.services.executors import LEGACY, TASKS
from toolops.services.reconcile import (
    reconciliation_abandon,
    reconciliation_accept_terminal,
    reconciliation_attach_remote_id,
)
from toolops.services.rollout import operation_hand_over_locked
from toolops.simulation.plan import SeriesPlan
from toolops.simulation.server import EPOCH

if TYPE_CHECKING:
    from toolops.simulation.runner import _Run

# The simulated operator looks at a new queue item this long after it opened: well within the
# 15-minute UNKNOWN figure, and long enough that the row really sits in the queue first.
OPERATOR_DELAY_S = 120.0
OPERATOR = "sim-operator"


class ExtraFaults:
    """Per-run state of the three faults: the rolled keys, the operator's pending items."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        self.rolled: set[str] = set()
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self.revoked: dict[str, str] = {}  # submission key -> the lease the roll revoked
        for sim in run.sims:
            sim.on_answer_in_flight = self.epoch_roll
            sim.may_roll = self._polling

    def _polling(self) -> bool:
        return bool(getattr(self.run.polling, "active", False))

    def epoch_roll(self, key: str) -> None:
        """Hand the row over and back while its poll answer is in flight (one durable transaction)."""
        with transaction.atomic(durable=True):
            op = Operation.objects.select_for_update().filter(submission_key=key).first()
            if op is None or op.state != State.WORKING or op.lease_owner == "":
                return  # nothing in flight to make stale
            now = self.run.clock.now()
            revoked = op.lease_owner
            reason = "simulation: epoch roll while a poll answer is in flight"
            operation_hand_over_locked(op=op, to_path=LEGACY, reason=reason, actor=OPERATOR, now=now)
            op = Operation.objects.select_for_update().get(id=op.id)
            operation_hand_over_locked(op=op, to_path=TASKS, reason=reason, actor=OPERATOR, now=now)
        with self._lock:
            self.rolled.add(key)
            self.revoked[key] = revoked

    def operator_sweep(self, now_s: float) -> float | None:
        """Resolve due queue items with the ground truth; returns when the next one falls due."""
        items = list(ReconciliationItem.objects.filter(
            status=ReconciliationItem.Status.OPEN, operation__server__in=self.run.servers,
        ).values_list("id", "created_at", "operation__submission_key", "operation_id",
                      "operation__remote_id").order_by("id"))
        keys = [key for _id, _created, key, _op, _rid in items]
        truth: dict[str, str] = {}
        task_ids: dict[str, str] = {}
        for sim in self.run.sims:
            # The server's console, lies included.
            truth.update(sim.truth(as_reported=True, keys=keys))
            task_ids.update(sim.task_ids(keys=keys))
        next_due: float | None = None
        for item_id, created, key, op_id, remote_id in items:
            due = (created - EPOCH).total_seconds() + OPERATOR_DELAY_S
            want = truth.get(key)
            if due <= now_s and not remote_id and want is not None \
                    and want not in TerminalStatus.values and key in task_ids:
                # A row that never learned its task while the server still runs it (its input
                # round unanswered, say): the operator finds the task in the console and hands
                # its id to the row, which polls on from there.
                self._settle(op_id, "attached", functools.partial(
                    reconciliation_attach_remote_id, item_id=item_id, remote_id=task_ids[key],
                    actor=OPERATOR,
                    reason="the server's console shows this key's task still running"))
                continue
            if due > now_s or (want is not None and want not in TerminalStatus.values):
                # Not yet looked at, or the server still works on it: look again later.
                later = due if due > now_s else now_s + OPERATOR_DELAY_S
                next_due = later if next_due is None else min(next_due, later)
                continue
            if want is None:
                self._settle(op_id, "abandoned", functools.partial(
                    reconciliation_abandon, item_id=item_id, actor=OPERATOR,
                    reason="the server never had this task: unknowable"))
            else:
                self._settle(op_id, "accepted", functools.partial(
                    reconciliation_accept_terminal, item_id=item_id, terminal_status=want,
                    actor=OPERATOR, evidence={"seen": "simulated server ground truth", "status": want},
                    reason=f"the server's operator confirms {want}"))
        return next_due

    def _settle(self, op_id: uuid.UUID, kind: str, resolve: Callable[[], object]) -> None:
        """One resolution by the operator; a refusal is a finding on the series."""
        try:
            resolve()
        except (ToolopsError, LedgerError) as exc:
            index = self.run.op_index.get(op_id)
            if index is not None:
                self.run.outcomes[index].errors.append(f"operator: {exc}")
            return
        self._count(f"operator_{kind}")

    def problems(self, plan: SeriesPlan, keys: list[str]) -> list[str]:
        """Findings for one series: a planned fault that did not leave the record it must."""
        out = []
        events = OperationEvent.objects.filter(operation__submission_key__in=keys)
        for key in (k for k in keys if k in self.rolled):
            mine = events.filter(operation__submission_key=key)
            if mine.filter(kind="stale_epoch_refused").exists():
                self._count("stale_epoch_refused")
                continue
            # What the rolled-over worker did instead: the events after the first bump.
            bump = mine.filter(kind="epoch_bumped").order_by("seq").values_list("seq", flat=True).first()
            after = list(mine.filter(seq__gt=bump or 0).order_by("seq").values_list("kind", flat=True)[:8])
            out.append(f"key {key}: epoch rolled mid-poll (lease {self.revoked.get(key)!r}) but no "
                       f"stale_epoch_refused event; events after the bump: {after}")
        if plan.foreign_task_id and events.filter(
                kind="poll_error", data__type="ProtocolViolationError").exists():
            self._count("foreign_task_id_refused")
        if plan.forget_before_ttl and ReconciliationItem.objects.filter(
                operation__submission_key__in=keys, reason="not_found_unknown").exists():
            self._count("forgotten_to_queue")
        if plan.expire_after_s is not None and not plan.forget_before_ttl:
            queued = ReconciliationItem.objects.filter(
                operation__submission_key__in=keys,
                reason__in=("expired", "not_found_unknown", "result_not_found",
                            "cancel_target_not_found")).exists()
            self._count("expired_to_queue" if queued else "expired_after_receipt")
        return out

    def _count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def summary(self) -> dict[str, int]:
        return {"epoch_rolled_in_flight": len(self.rolled), **self.counts}
