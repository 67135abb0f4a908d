"""No stranded rows (op_open_row_scheduled) and one operation per remote task.

Before the CHECK is added, rows that are already stranded (a polled state with neither a next
poll time nor a lease: left by a worker that died between two writes) are made due now, so the
dispatcher picks them up; nothing else about them changes. Rows that already share a remote id
are not rewritten (which one is right is an operator's call): the migration stops and names them.
"""

from django.db import migrations, models
from django.db.models import Count

SCHEDULED = ["SUBMITTING", "SUBMISSION_UNKNOWN", "WORKING", "CANCEL_REQUESTED",
             "TERMINAL_OBSERVED", "FETCHING_RESULT"]


def heal_and_check(apps, schema_editor):  # type: ignore[no-untyped-def]
    from django.utils import timezone

    Operation = apps.get_model("ledger", "Operation")
    Operation.objects.filter(state__in=SCHEDULED, next_poll_at__isnull=True,
                             lease_expires_at__isnull=True).update(next_poll_at=timezone.now())
    shared = list(Operation.objects.exclude(remote_id="").values("server_id", "remote_id")
                  .annotate(n=Count("id")).filter(n__gt=1)[:20])
    if shared:
        raise RuntimeError(
            "operations share a (server, remote id) pair; resolve them (toolops gate lists them "
            f"under duplicate_operations) before migrating: {shared}"
        )


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0007_rollout_executors"),
    ]

    operations = [
        migrations.RunPython(heal_and_check, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name="operation",
            index=models.Index(condition=models.Q(("lease_expires_at__isnull", False), ("next_poll_at__isnull", True)), fields=["lease_expires_at"], name="op_lease_unscheduled_idx"),
        ),
        migrations.AddConstraint(
            model_name="operation",
            constraint=models.CheckConstraint(condition=models.Q(models.Q(("state__in", ["SUBMITTING", "SUBMISSION_UNKNOWN", "WORKING", "CANCEL_REQUESTED", "TERMINAL_OBSERVED", "FETCHING_RESULT"]), _negated=True), ("next_poll_at__isnull", False), ("lease_expires_at__isnull", False), _connector="OR"), name="op_open_row_scheduled"),
        ),
        migrations.AddConstraint(
            model_name="operation",
            constraint=models.UniqueConstraint(condition=models.Q(("remote_id", ""), _negated=True), fields=("server", "remote_id"), name="op_one_operation_per_remote_task"),
        ),
    ]
