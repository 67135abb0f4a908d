"""When each open row next becomes claimable, in a narrow table of its own.

The dispatcher's claim walks this table's one index instead of a partial index of the wide
operation row. A claim writes the lease and the next poll time onto the operation row; when no
index of that row holds those columns, PostgreSQL can write the new version as a HOT update (no
index entry at all), so a claim of 1,000 rows writes 1,000 narrow rows and their two index entries
instead of a new entry in each of the wide row's ten indexes.

Written in the statement that changes the operation, so the two can never disagree at any
commit: triggers on the operation table (installed by migration 0016_operation_due) keep one row
here for every operation in a SCHEDULED_STATES state, with `due_at` = the later of its next poll
time and its lease's end. There is one exception, on PostgreSQL: the dispatcher's claim moves the
due entries of the rows it leases itself, in its own statement and set-based, and the update
trigger skips exactly that write (the one that sets a row's lease owner to the value of
CLAIM_OWNER_SETTING in the claim's transaction; migration 0018_claim_writes_its_due_rows). No
other application code writes it.
"""

from __future__ import annotations

from django.db import models

from ledger.models.operations import Operation
from ledger.models.servers import ToolServer

# The transaction-local setting in which a claim announces its lease owner, so that the update
# trigger leaves that one write's due entries to the claim's own statement (see above).
CLAIM_OWNER_SETTING = "toolops.claim_owner"


class OperationDue(models.Model):
    """One open, scheduled operation: when it becomes claimable (derived, database-written)."""

    operation = models.OneToOneField(Operation, on_delete=models.CASCADE, primary_key=True,
                                     related_name="due")
    # GREATEST(next_poll_at, lease_expires_at): a row whose lease runs is not claimable before
    # the lease ends, however early its next poll time; a lapsed lease is due at its end.
    due_at = models.DateTimeField()
    # Copied so a claim scoped to some servers or one executor path filters while it walks the
    # due index, without a join per candidate. No index of their own: every index here is
    # written by every claim.
    server = models.ForeignKey(ToolServer, on_delete=models.DO_NOTHING, db_constraint=False,
                               db_index=False, related_name="+")
    executor_path = models.CharField(max_length=8)

    class Meta:
        indexes = [models.Index(fields=["due_at"], name="opdue_due_idx")]

    def __str__(self) -> str:
        return f"{self.operation_id} due {self.due_at:%Y-%m-%d %H:%M:%S}"
