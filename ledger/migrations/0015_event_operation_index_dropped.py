# The event's own index on operation_id goes: the unique constraint event_seq_unique
# (operation_id, seq) leads with the same column and answers every lookup by operation, while the
# second index was written on every event (six per completed call). Only the index is dropped:
# Django's AlterField would also drop and re-add the foreign key, re-checking every event row
# under a lock, for a constraint that does not change.

import django.db.models.deletion
from django.db import migrations, models

INDEX = "ledger_operationevent_operation_id_a2e1e3a0"


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0014_submission_key_constraint'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='operationevent',
                    name='operation',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                            related_name='events', to='ledger.operation'),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    sql=f'DROP INDEX IF EXISTS "{INDEX}"',
                    reverse_sql=f'CREATE INDEX IF NOT EXISTS "{INDEX}" ON "ledger_operationevent" ("operation_id")',
                ),
            ],
        ),
    ]
