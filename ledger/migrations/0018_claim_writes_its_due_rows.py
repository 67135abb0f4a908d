# The dispatcher's claim moves the due entries of the rows it leases itself, in its own statement
# and set-based (one UPDATE of the due table for the whole batch), instead of through the row
# trigger: at 1,000 rows a claim spent about a fifth of its time in the trigger's per-row PL/pgSQL
# call and its SPI UPDATE (benchmarks/claims_at_scale.py; docs/architecture.md, "The due table").
#
# The row trigger now skips exactly one kind of write: one that sets the row's lease owner to the
# owner this transaction's claim announced in `toolops.claim_owner` (a transaction-local setting,
# set by the claim statement itself). A claim's owner is a fresh token per claim, so no other
# write can match: a later write in the same transaction that leaves the owner as it is, or sets
# another one, still takes the trigger, and outside that transaction the setting is empty. Every
# other code path keeps the trigger as its only writer of the due table. On SQLite (the embedded
# default) the claim is a plain ORM update and the trigger there is unchanged.
from django.db import migrations

_DUE_COLUMNS_CHANGED = """
        OLD.state IS DISTINCT FROM NEW.state
        OR OLD.next_poll_at IS DISTINCT FROM NEW.next_poll_at
        OR OLD.lease_expires_at IS DISTINCT FROM NEW.lease_expires_at
        OR OLD.server_id IS DISTINCT FROM NEW.server_id
        OR OLD.executor_path IS DISTINCT FROM NEW.executor_path"""

# The skip is spelled so that a session which never claimed (setting unknown: NULL) and a
# transaction after a claim's (setting reset to '') both take the trigger: only equality with a
# non-empty owner that this very write sets skips it. Evaluated in C, after the cheaper test above.
_NOT_THE_CLAIMS_OWN_WRITE = """
        (OLD.lease_owner IS NOT DISTINCT FROM NEW.lease_owner
         OR NEW.lease_owner = ''
         OR NEW.lease_owner IS DISTINCT FROM current_setting('toolops.claim_owner', true))"""

FORWARD = [
    "DROP TRIGGER IF EXISTS ledger_operation_due_on_update ON ledger_operation",
    f"""
    CREATE TRIGGER ledger_operation_due_on_update AFTER UPDATE ON ledger_operation
    FOR EACH ROW WHEN (({_DUE_COLUMNS_CHANGED}) AND {_NOT_THE_CLAIMS_OWN_WRITE})
    EXECUTE FUNCTION ledger_operation_due_sync()
    """,
]

REVERSE = [
    "DROP TRIGGER IF EXISTS ledger_operation_due_on_update ON ledger_operation",
    f"""
    CREATE TRIGGER ledger_operation_due_on_update AFTER UPDATE ON ledger_operation
    FOR EACH ROW WHEN ({_DUE_COLUMNS_CHANGED})
    EXECUTE FUNCTION ledger_operation_due_sync()
    """,
]


def _run(statements: list[str]):  # type: ignore[no-untyped-def]
    def run(apps: object, schema_editor: object) -> None:
        connection = schema_editor.connection  # type: ignore[attr-defined]
        if connection.vendor != "postgresql":
            return
        with connection.cursor() as cursor:
            for sql in statements:
                cursor.execute(sql)
    return run


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0017_input_request_id_reuse'),
    ]

    operations = [
        migrations.RunPython(_run(FORWARD), _run(REVERSE)),
    ]
