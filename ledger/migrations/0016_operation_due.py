# The claim's due index moves to a narrow table (ledger.models.due) that triggers keep in step
# with the operation row, and the operation row loses the two partial indexes on next_poll_at and
# lease_expires_at. With no index on the columns a claim writes, the claim's UPDATE of the wide row
# can be HOT (no index entries); the table keeps a fifth of each page free for those versions.
#
# The trigger is the only writer of ledger_operationdue. It runs in the statement that changes the
# operation (after the row is written, so the row's own CHECK constraints have already passed), so
# an open row and its due entry are equal at every commit, whichever code path wrote the row.
# The state list is the one of this migration (SCHEDULED_STATES when it was written); a later
# change of that set needs a migration that replaces the functions below
# (tests/ledger/test_due.py compares them behaviourally with SCHEDULED_STATES).
#
# On SQLite, a later migration that Django carries out by rebuilding ledger_operation (most
# AlterField and RemoveField operations there) drops these triggers with the old table: such a
# migration must install them again.
#
# An existing table's full pages take HOT updates only once later writes free room in them: on a
# large installed ledger, rewrite the table once (VACUUM FULL or pg_repack) to apply the fillfactor.

import django.db.models.deletion
from django.db import migrations, models

STATES = ("'SUBMITTING', 'SUBMISSION_UNKNOWN', 'WORKING', 'CANCEL_REQUESTED', "
          "'TERMINAL_OBSERVED', 'FETCHING_RESULT'")

POSTGRESQL = [
    f"""
    CREATE FUNCTION ledger_operation_due_sync() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        -- UPDATE first, INSERT only when there was no entry: INSERT ... ON CONFLICT DO UPDATE
        -- costs a speculative insertion on every call (measured: about 80 us a row against 20).
        IF NEW.state IN ({STATES}) THEN
            IF TG_OP = 'UPDATE' THEN
                UPDATE ledger_operationdue
                SET due_at = GREATEST(NEW.next_poll_at, NEW.lease_expires_at),
                    server_id = NEW.server_id, executor_path = NEW.executor_path
                WHERE operation_id = NEW.id;
            END IF;
            IF TG_OP = 'INSERT' OR NOT FOUND THEN
                INSERT INTO ledger_operationdue (operation_id, due_at, server_id, executor_path)
                VALUES (NEW.id, GREATEST(NEW.next_poll_at, NEW.lease_expires_at), NEW.server_id,
                        NEW.executor_path);
            END IF;
        ELSIF TG_OP = 'UPDATE' THEN
            DELETE FROM ledger_operationdue WHERE operation_id = NEW.id;
        END IF;
        RETURN NULL;
    END
    $$
    """,
    # Only when a column the entry is made of changes: every other update (the reply's remote id,
    # a status message, the poll counters) costs one comparison in C and no function call.
    """
    CREATE TRIGGER ledger_operation_due_on_update AFTER UPDATE ON ledger_operation
    FOR EACH ROW WHEN (
        OLD.state IS DISTINCT FROM NEW.state
        OR OLD.next_poll_at IS DISTINCT FROM NEW.next_poll_at
        OR OLD.lease_expires_at IS DISTINCT FROM NEW.lease_expires_at
        OR OLD.server_id IS DISTINCT FROM NEW.server_id
        OR OLD.executor_path IS DISTINCT FROM NEW.executor_path)
    EXECUTE FUNCTION ledger_operation_due_sync()
    """,
    f"""
    CREATE TRIGGER ledger_operation_due_on_insert AFTER INSERT ON ledger_operation
    FOR EACH ROW WHEN (NEW.state IN ({STATES}))
    EXECUTE FUNCTION ledger_operation_due_sync()
    """,
    "ALTER TABLE ledger_operation SET (fillfactor = 80)",
]

POSTGRESQL_REVERSE = [
    "DROP TRIGGER IF EXISTS ledger_operation_due_on_insert ON ledger_operation",
    "DROP TRIGGER IF EXISTS ledger_operation_due_on_update ON ledger_operation",
    "DROP FUNCTION IF EXISTS ledger_operation_due_sync()",
    "ALTER TABLE ledger_operation RESET (fillfactor)",
]

# SQLite (the embedded default): no GREATEST, and MAX(a, b) is NULL when either is; datetimes are
# ISO text, which orders as time.
SQLITE_DUE = ("MAX(COALESCE(NEW.next_poll_at, NEW.lease_expires_at), "
              "COALESCE(NEW.lease_expires_at, NEW.next_poll_at))")
SQLITE = [
    f"""
    CREATE TRIGGER ledger_operation_due_on_insert AFTER INSERT ON ledger_operation
    FOR EACH ROW WHEN NEW.state IN ({STATES}) BEGIN
        INSERT INTO ledger_operationdue (operation_id, due_at, server_id, executor_path)
        VALUES (NEW.id, {SQLITE_DUE}, NEW.server_id, NEW.executor_path);
    END
    """,
    f"""
    CREATE TRIGGER ledger_operation_due_on_update
    AFTER UPDATE OF state, next_poll_at, lease_expires_at, server_id, executor_path
    ON ledger_operation FOR EACH ROW BEGIN
        DELETE FROM ledger_operationdue
            WHERE operation_id = NEW.id AND NEW.state NOT IN ({STATES});
        INSERT OR REPLACE INTO ledger_operationdue (operation_id, due_at, server_id, executor_path)
            SELECT NEW.id, {SQLITE_DUE}, NEW.server_id, NEW.executor_path
            WHERE NEW.state IN ({STATES});
    END
    """,
]

SQLITE_REVERSE = [
    "DROP TRIGGER IF EXISTS ledger_operation_due_on_insert",
    "DROP TRIGGER IF EXISTS ledger_operation_due_on_update",
]

BACKFILL = f"""
    INSERT INTO ledger_operationdue (operation_id, due_at, server_id, executor_path)
    SELECT id, {{due}}, server_id, executor_path FROM ledger_operation WHERE state IN ({STATES})
"""


def install(apps: object, schema_editor: object) -> None:
    connection = schema_editor.connection  # type: ignore[attr-defined]
    if connection.vendor == "postgresql":
        statements = POSTGRESQL
        due = "GREATEST(next_poll_at, lease_expires_at)"
    elif connection.vendor == "sqlite":
        statements = SQLITE
        due = SQLITE_DUE.replace("NEW.", "")
    else:
        raise NotImplementedError(f"no due-table triggers for {connection.vendor}")
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute(sql)
        cursor.execute(BACKFILL.format(due=due))


def uninstall(apps: object, schema_editor: object) -> None:
    connection = schema_editor.connection  # type: ignore[attr-defined]
    statements = POSTGRESQL_REVERSE if connection.vendor == "postgresql" else SQLITE_REVERSE
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute(sql)


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0015_event_operation_index_dropped'),
    ]

    operations = [
        migrations.CreateModel(
            name='OperationDue',
            fields=[
                ('operation', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='due', serialize=False, to='ledger.operation')),
                ('due_at', models.DateTimeField()),
                ('server', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='ledger.toolserver')),
                ('executor_path', models.CharField(max_length=8)),
            ],
            options={
                'indexes': [models.Index(fields=['due_at'], name='opdue_due_idx')],
            },
        ),
        migrations.RunPython(install, uninstall),
        migrations.RemoveIndex(
            model_name='operation',
            name='op_due_free_idx',
        ),
        migrations.RemoveIndex(
            model_name='operation',
            name='op_leased_idx',
        ),
    ]
