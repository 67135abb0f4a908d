# The submission key's uniqueness as a named constraint instead of unique=True: the same unique
# index, without the varchar_pattern_ops twin Django adds for unique=True on PostgreSQL, which no
# query uses and every claimed row's UPDATE had to write. The constraint is added before the old
# index goes, so the key is never without one.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0013_terminal_status_checks'),
    ]

    operations = [
        migrations.AddConstraint(
            model_name='operation',
            constraint=models.UniqueConstraint(fields=('submission_key',), name='op_submission_key_unique'),
        ),
        migrations.AlterField(
            model_name='operation',
            name='submission_key',
            field=models.CharField(max_length=64),
        ),
    ]
