"""A server request id is unique per operation only among rounds still waiting for delivery.

mcp 1.30 reuses a task's request ids once the earlier request is answered, so a delivered round's
id may open a later round (toolops/services/input_replays.py decides when).
"""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0016_operation_due'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='inputrequest',
            name='input_one_round_per_server_request',
        ),
        migrations.AddConstraint(
            model_name='inputrequest',
            constraint=models.UniqueConstraint(condition=models.Q(('delivered_at__isnull', True)), fields=('operation', 'server_request_id'), name='input_one_open_round_per_server_request'),
        ),
    ]
