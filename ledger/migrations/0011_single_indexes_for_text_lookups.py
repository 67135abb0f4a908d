"""One index per looked-up text column, and none where a composite index already answers.

`db_index=True` on a CharField gives two indexes on PostgreSQL (a plain btree and a
varchar_pattern_ops twin for LIKE 'prefix%'); nothing here queries those columns by a
case-sensitive prefix, and each index is one more write for every row a claim leases.
call_node_id and tenant keep a plain btree (declared in Meta); remote_id keeps none of its own:
every lookup also names the server, which op_one_operation_per_remote_task answers. The two
btrees are rebuilt under new names (build them CONCURRENTLY first on a large live table).
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0010_claim_branch_indexes'),
    ]

    operations = [
        migrations.AlterField(
            model_name='operation',
            name='call_node_id',
            field=models.CharField(max_length=200),
        ),
        migrations.AlterField(
            model_name='operation',
            name='remote_id',
            field=models.CharField(blank=True, max_length=300),
        ),
        migrations.AlterField(
            model_name='operation',
            name='tenant',
            field=models.CharField(blank=True, default='', max_length=100),
        ),
        migrations.AddIndex(
            model_name='operation',
            index=models.Index(fields=['call_node_id'], name='op_call_node_idx'),
        ),
        migrations.AddIndex(
            model_name='operation',
            index=models.Index(fields=['tenant'], name='op_tenant_idx'),
        ),
    ]
