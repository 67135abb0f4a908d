"""`toolOperation.v1` (docs/architecture.md) and its append-only event series."""

from __future__ import annotations

import uuid

from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from ledger.models.servers import ToolServer
from ledger.states import State, TerminalStatus

# The counters and versions of a row are never negative. PositiveIntegerField would say so with
# one CHECK constraint per column; these tables instead carry one constraint each for all of
# them (`*_counters_not_negative`): PostgreSQL rebuilds every CHECK constraint of a table from its
# stored text for each statement that writes a row of it, and the operation row is written three
# to four times a call. Nine constraints folded into one took about 15 µs off each UPDATE of it
# (pgbench, one client). The validator keeps forms and full_clean() refusing negatives.
NOT_NEGATIVE = MinValueValidator(0)


def not_negative(*fields: str) -> Q:
    """One condition for all of `fields`: each at least 0. A NULL passes, as a CHECK constraint
    lets an unknown through (and Django's validation does the same)."""
    return Q(*[Q(**{f"{name}__gte": 0}) for name in fields])

# States in which a row is polled or resolved by the executor (the dispatcher's CLAIMABLE set,
# toolops.services.dispatch). A row in one of them is always either due (`next_poll_at`) or
# leased (`lease_expires_at`; an expired lease is re-claimed): constraint op_open_row_scheduled;
# and it has its entry in ledger_operationdue, which the triggers of migration 0016 keep from
# this same list of states (ledger.models.due).
# The other open states wait on someone else: INPUT_REQUIRED on its input round,
# RECONCILIATION_REQUIRED on its queue item (the gate checks those two, a CHECK cannot).
SCHEDULED_STATES = (
    State.SUBMITTING, State.SUBMISSION_UNKNOWN, State.WORKING, State.CANCEL_REQUESTED,
    State.TERMINAL_OBSERVED, State.FETCHING_RESULT,
)


class Operation(models.Model):
    """One operation attempt of a call node: the ledger row every flow guards."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    call_node_id = models.CharField(max_length=200)  # indexed in Meta (op_call_node_idx)
    server = models.ForeignKey(ToolServer, on_delete=models.PROTECT, related_name="operations")
    tool_name = models.CharField(max_length=200)
    descriptor_version = models.CharField(max_length=80)
    request_digest = models.CharField(max_length=80)
    body = models.JSONField(default=dict)
    adapter_version = models.CharField(max_length=64)
    # "task" (MCP task / LRO) or "sync" (the tool's published synchronous bound).
    execution_mode = models.CharField(max_length=8, default="task")
    submission_key = models.CharField(max_length=64)  # op_submission_key_unique
    # Organisation slug (ledger/models/tenancy.py); blank for embedded/CLI use without tenancy.
    tenant = models.CharField(max_length=100, blank=True, default="")  # op_tenant_idx
    # Digest of the submission as the caller sent it (Idempotency-Key replays compare it).
    submission_digest = models.CharField(max_length=80, blank=True, default="")
    # Every lookup names the server too: op_one_operation_per_remote_task is its index.
    remote_id = models.CharField(max_length=300, blank=True)

    state = models.CharField(max_length=32, choices=State.choices, default=State.SUBMITTING)
    server_state = models.CharField(max_length=64, blank=True)  # verbatim server status
    server_status_message = models.TextField(blank=True)

    # poll cursor
    next_poll_at = models.DateTimeField(null=True, blank=True)
    poll_attempts = models.IntegerField(default=0, validators=[NOT_NEGATIVE])
    observation_seq = models.BigIntegerField(default=0, validators=[NOT_NEGATIVE])
    lease_owner = models.CharField(max_length=100, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    poll_interval_ms = models.IntegerField(null=True, blank=True, validators=[NOT_NEGATIVE])
    # A working poll that changes nothing is counted here, not written as an event: the event
    # series stays bounded per call (state changes and what an operator must see).
    polls_count = models.IntegerField(default=0, validators=[NOT_NEGATIVE])
    last_polled_at = models.DateTimeField(null=True, blank=True)
    # Failed protocol calls in a row (reset by any answer): the backoff's exponent.
    poll_errors_in_row = models.IntegerField(default=0, validators=[NOT_NEGATIVE])
    # The last progress the server reported (AIP-151 `metadata`), to record only its changes.
    server_progress = models.JSONField(null=True, blank=True)

    input_round = models.IntegerField(default=0, validators=[NOT_NEGATIVE])
    cancel_generation = models.IntegerField(default=0, validators=[NOT_NEGATIVE])
    execution_epoch = models.IntegerField(default=1, validators=[MinValueValidator(1)])
    # Which executor owns the row: "legacy" (the synchronous path, and after a rollback
    # the continuation of task rows it inherited) or "tasks" (the task adapter path). A rollback
    # moves in-flight rows between the two and bumps execution_epoch in the same UPDATE.
    executor_path = models.CharField(max_length=8, default="tasks")
    # A shadow operation runs beside a legacy call of a side-effect-free tool. It never gets a
    # TerminalReceipt or an OutboxEvent (acceptance refuses), only a ShadowComparison.
    shadow = models.BooleanField(default=False)
    shadow_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT,
                                  related_name="shadows", db_index=False)  # op_shadow_of_idx
    ttl_ms = models.BigIntegerField(null=True, blank=True, validators=[NOT_NEGATIVE])
    expires_at = models.DateTimeField(null=True, blank=True)

    terminal_status = models.CharField(
        max_length=16, choices=TerminalStatus.choices, blank=True
    )
    result_kind = models.CharField(max_length=16, blank=True)  # result | error | empty
    result = models.JSONField(null=True, blank=True)
    result_digest = models.CharField(max_length=80, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        permissions = [("cancel_operation", "Can cancel operations")]
        indexes = [
            # No index holds next_poll_at, lease_owner, lease_expires_at or poll_attempts: the
            # dispatcher's claim finds due rows in ledger_operationdue (ledger.models.due) and
            # writes only those columns here, so the claim's write of this wide row can be a HOT
            # update (no index entry). An index on any of them would make every claim write every
            # index below once per claimed row.
            models.Index(fields=["state"], name="op_state_idx"),
            # Declared here rather than with db_index, which on PostgreSQL adds a second,
            # varchar_pattern_ops index for LIKE 'prefix%' that no query here uses (admin prefix
            # search is case-insensitive). Every index is written by every update that is not
            # HOT (a state change, the reply that sets remote_id): each one dropped is one write
            # fewer per row.
            models.Index(fields=["call_node_id"], name="op_call_node_idx"),
            models.Index(fields=["tenant"], name="op_tenant_idx"),
            # Almost every row has no shadow: only those that do are indexed (a lookup by a
            # shadow's legacy row, and the PROTECT check on delete, name a non-null id).
            models.Index(fields=["shadow_of"], name="op_shadow_of_idx",
                         condition=Q(shadow_of__isnull=False)),
        ]
        constraints = [
            # A constraint rather than unique=True, which on PostgreSQL adds a varchar_pattern_ops
            # twin that no query uses and every update that is not HOT would write.
            models.UniqueConstraint(fields=["submission_key"], name="op_submission_key_unique"),
            models.CheckConstraint(condition=Q(execution_epoch__gte=1), name="op_epoch_positive"),
            models.CheckConstraint(condition=not_negative(
                "poll_attempts", "observation_seq", "poll_interval_ms", "polls_count",
                "poll_errors_in_row", "input_round", "cancel_generation", "ttl_ms"),
                name="op_counters_not_negative"),
            # At most one live attempt per call node, whatever its epoch. Only NOT_FOUND_SAFE
            # (proof that nothing was created) frees the call node for a new attempt; an
            # abandoned or unresolved one keeps it, because its remote work may still exist.
            # Not per epoch: a rollback bumps a row's epoch, and a second attempt at the
            # old epoch would then be a second remote operation and a second receipt slot.
            # Shadow rows are not attempts of the call node (they never get a receipt).
            models.UniqueConstraint(
                fields=["tenant", "call_node_id"],
                condition=~Q(state="NOT_FOUND_SAFE") & Q(shadow=False),
                name="op_one_live_attempt_per_node",
            ),
            models.CheckConstraint(condition=Q(executor_path__in=["legacy", "tasks"]),
                                   name="op_executor_path_known"),
            # What the receipt will carry: only a terminal status (or none yet) is ever recorded
            # as one, whatever a server said and whichever code path wrote it.
            models.CheckConstraint(
                condition=Q(terminal_status="") | Q(terminal_status__in=TerminalStatus.values),
                name="op_terminal_status_terminal"),
            # A shadow row always names the legacy row it shadows.
            models.CheckConstraint(condition=Q(shadow=False) | Q(shadow_of__isnull=False),
                                   name="op_shadow_has_legacy"),
            # No stranded row: a row the executor works on is due or leased at every commit.
            models.CheckConstraint(
                condition=~Q(state__in=[s.value for s in SCHEDULED_STATES])
                | Q(next_poll_at__isnull=False) | Q(lease_expires_at__isnull=False),
                name="op_open_row_scheduled",
            ),
            # One remote task, one operation: a server's task id is claimed by one row only; a
            # second row that is handed the same id goes to the reconciliation queue instead.
            models.UniqueConstraint(fields=["server", "remote_id"], condition=~Q(remote_id=""),
                                    name="op_one_operation_per_remote_task"),
        ]

    def __str__(self) -> str:
        return f"{self.call_node_id}:{self.tool_name} [{self.state}]"


class OperationEvent(models.Model):
    """Append-only, per-operation ordered series of every transition and observation."""

    # No index of its own: event_seq_unique (operation, seq) leads with it and answers every
    # lookup by operation; a second index would be written on every event (six a call) for nothing.
    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="events",
                                  db_index=False)
    seq = models.IntegerField(validators=[NOT_NEGATIVE])
    kind = models.CharField(max_length=40)
    from_state = models.CharField(max_length=32, blank=True)
    to_state = models.CharField(max_length=32, blank=True)
    server_state = models.CharField(max_length=64, blank=True)
    execution_epoch = models.IntegerField(validators=[NOT_NEGATIVE])
    cancel_generation = models.IntegerField(validators=[NOT_NEGATIVE])
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["operation_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["operation", "seq"], name="event_seq_unique"),
            models.CheckConstraint(condition=not_negative("seq", "execution_epoch",
                                                          "cancel_generation"),
                                   name="event_counters_not_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.operation_id}#{self.seq} {self.kind}"
