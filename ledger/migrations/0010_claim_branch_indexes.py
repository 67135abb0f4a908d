"""The claim's two branches get one partial index each, replacing the index on every scheduled row.

op_due_free_idx holds only due rows with no lease, so the claim's ordered walk never steps past a
row in flight; op_leased_idx holds leased rows (their lapse is the claim's second branch). Both
are built inside the migration's transaction: on a large live table, build them first with
CREATE INDEX CONCURRENTLY under the same names and definitions.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0009_merge'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='operation',
            name='op_next_poll_idx',
        ),
        migrations.RemoveIndex(
            model_name='operation',
            name='op_lease_unscheduled_idx',
        ),
        migrations.AddIndex(
            model_name='operation',
            index=models.Index(condition=models.Q(('lease_expires_at__isnull', True), ('next_poll_at__isnull', False), ('state__in', ['SUBMITTING', 'SUBMISSION_UNKNOWN', 'WORKING', 'CANCEL_REQUESTED', 'TERMINAL_OBSERVED', 'FETCHING_RESULT'])), fields=['next_poll_at'], name='op_due_free_idx'),
        ),
        migrations.AddIndex(
            model_name='operation',
            index=models.Index(condition=models.Q(('lease_expires_at__isnull', False), ('state__in', ['SUBMITTING', 'SUBMISSION_UNKNOWN', 'WORKING', 'CANCEL_REQUESTED', 'TERMINAL_OBSERVED', 'FETCHING_RESULT'])), fields=['lease_expires_at'], name='op_leased_idx'),
        ),
    ]
