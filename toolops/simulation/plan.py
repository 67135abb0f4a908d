"""Per-series fault plans: a pure function of (seed, series index), so one series replays alone."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

# Fault probabilities per series. Every series draws each independently, so a run of N series
# holds random interleavings of all of them (several faults on one series are common).
P_LOST_CREATE_AFTER = 0.06   # the server created the task, its reply is lost
P_LOST_CREATE_UNSENT = 0.03  # the request never reached the server (also read as a lost reply)
P_THROTTLE = 0.12            # 429 or 503 with Retry-After on the first polls
P_CANCEL = 0.25              # a concurrent cancel at a random moment
P_CANCEL_AT_COMPLETION = 0.25  # of cancels: sent the very second the work completes
P_CANCEL_ACK_LOST = 0.3      # of cancels: the server cancels but the reply is lost
P_INPUT = 0.2                # one input round
P_REPLAY_INPUT = 0.3         # of input rounds: `input_required` replayed after the answer
P_RESULT_LOST = 0.08         # tasks/result lost after tasks/get said terminal
P_RESULT_TRUNCATED = 0.05    # tasks/result cut mid-stream
P_STALE = 0.06               # an out-of-order poll answer (working after terminal)
P_WRONG_ID = 0.04            # tasks/get answers about another task id
P_FAILED = 0.15              # the work itself fails
P_EPOCH_ROLL = 0.05          # the row's epoch is rolled while a poll answer of the old one is in flight
P_FORGET = 0.04              # the server forgets the finished task before its ttl (404: UNKNOWN)
P_FOREIGN_ID = 0.04          # tasks/get names a task of another server's session
P_SHORT_TTL = 0.05           # a ttl that ends soon after the work: 404 after expiry, or no 404 at all


@dataclass(frozen=True)
class SeriesPlan:
    index: int
    start_s: float
    work_s: float
    outcome: str
    lost_create: str  # "" | "after" | "unsent"
    throttle: int  # 0 | 429 | 503
    throttle_times: int
    cancel_at_s: float | None  # relative to the start
    cancel_ack_lost: bool
    input_after_s: float | None
    answer_delay_s: float
    replay_input: bool
    result_fault: str  # "" | "lost" | "truncated"
    stale_after_terminal: bool
    wrong_task_id: bool
    # Drawn after the fields above, so adding them left every earlier plan of a seed unchanged.
    epoch_roll: bool = False
    forget_before_ttl: bool = False
    foreign_task_id: bool = False
    # Seconds after the work ends that the server's ttl runs out (series without input rounds,
    # whose end is not known in advance); None: the usual hour.
    expire_after_s: float | None = None

    def faults(self) -> list[str]:
        d = asdict(self)
        return [k for k in ("lost_create", "throttle", "cancel_at_s", "cancel_ack_lost",
                            "input_after_s", "replay_input", "result_fault", "stale_after_terminal",
                            "wrong_task_id", "epoch_roll", "forget_before_ttl",
                            "foreign_task_id", "expire_after_s") if d[k] not in (None, "", 0, False)]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def series_plan(*, seed: int, index: int, arrival_per_s: float) -> SeriesPlan:
    rng = random.Random(f"{seed}:{index}")
    work = rng.uniform(2.0, 40.0)
    u = rng.random()
    lost = "after" if u < P_LOST_CREATE_AFTER else (
        "unsent" if u < P_LOST_CREATE_AFTER + P_LOST_CREATE_UNSENT else "")
    throttle = rng.choice((429, 503)) if rng.random() < P_THROTTLE else 0
    input_after = rng.uniform(0.2, 0.8) * work if rng.random() < P_INPUT else None
    cancel_at = None
    ack_lost = False
    if rng.random() < P_CANCEL:
        if rng.random() < P_CANCEL_AT_COMPLETION and input_after is None:
            cancel_at = work  # completion and cancel at once
        else:
            cancel_at = rng.uniform(0.5, work * 1.3)
        ack_lost = rng.random() < P_CANCEL_ACK_LOST
    r = rng.random()
    result_fault = "lost" if r < P_RESULT_LOST else (
        "truncated" if r < P_RESULT_LOST + P_RESULT_TRUNCATED else "")
    return SeriesPlan(
        index=index, start_s=index / arrival_per_s + rng.uniform(0.0, 1.0), work_s=work,
        outcome="failed" if rng.random() < P_FAILED else "completed", lost_create=lost,
        throttle=throttle, throttle_times=rng.randint(1, 3), cancel_at_s=cancel_at,
        cancel_ack_lost=ack_lost, input_after_s=input_after, answer_delay_s=rng.uniform(1.0, 30.0),
        replay_input=input_after is not None and rng.random() < P_REPLAY_INPUT,
        result_fault=result_fault, stale_after_terminal=rng.random() < P_STALE,
        wrong_task_id=rng.random() < P_WRONG_ID,
        epoch_roll=rng.random() < P_EPOCH_ROLL, forget_before_ttl=rng.random() < P_FORGET,
        foreign_task_id=rng.random() < P_FOREIGN_ID,
        expire_after_s=_short_ttl(rng, input_after),
    )


def _short_ttl(rng: random.Random, input_after: float | None) -> float | None:
    # Drawn in every plan (even when unused) so later draws stay put when probabilities change.
    u, after = rng.random(), rng.uniform(0.5, 12.0)
    # 0.5 to 12 s after the work ends, against 3 s polls: some rows see the terminal state and
    # fetch in time, some poll only after expiry (404 with no receipt: UNKNOWN, the queue).
    return after if u < P_SHORT_TTL and input_after is None else None
