"""shadow_of is indexed only where it is set: almost every row has no shadow, and a claim (never a
HOT update) otherwise writes a NULL entry into this index for each row it leases.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0011_single_indexes_for_text_lookups'),
    ]

    operations = [
        migrations.AlterField(
            model_name='operation',
            name='shadow_of',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='shadows', to='ledger.operation'),
        ),
        migrations.AddIndex(
            model_name='operation',
            index=models.Index(condition=models.Q(('shadow_of__isnull', False)), fields=['shadow_of'], name='op_shadow_of_idx'),
        ),
    ]
