"""The acceptance point's one-statement form, for the common end of a poll cycle: the terminal
answer with its fetched result, the final state, the receipt, its outbox row and the events of
the way there, in ONE statement.

The step-by-step acceptance (ledger.services.acceptance) locks the row, checks every identity
field against it in Python and then inserts; in the common cycle that is a transaction of four
round trips (BEGIN, the guarded UPDATE that reads the row back, the receipt's INSERT, COMMIT).
Here the identity checks are guards of the UPDATE itself, so they run against the row under the
lock that UPDATE takes, and the receipt, the outbox row and the events read everything they need
from that UPDATE's RETURNING (data-modifying CTEs): the row written and its receipt cannot
disagree, and a statement is a transaction of its own (autocommit, no BEGIN or COMMIT).

It writes everything or nothing. Nothing is written, and `None` is returned, when:
- a guard does not hold (a moved state, epoch, lease or cancel generation, an identity field that
  is not the claim's): the caller's step-by-step path then finds and records why;
- the receipt's slot is taken (one receipt per call node and epoch, and per operation): the
  INSERT has no ON CONFLICT clause, so the unique violation refuses the whole statement;
- the events' `max(seq)` missed an event appended by the previous holder of the row's lock (a
  statement that waited for a lock keeps the snapshot it took before): the unique (operation,
  seq) constraint refuses the statement, and the caller's transaction sees that event.

Only PostgreSQL, outside any transaction, with nobody listening to the receipt's or the outbox's
save signals (ledger.services.inserts.one_statement_pair); elsewhere the caller goes step by step.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import IntegrityError

from ledger.models import OperationEvent, OutboxEvent, TerminalReceipt
from ledger.services.events import EventSpec, event_columns
from ledger.services.guarded import guarded_update_direct, guarded_update_statement
from ledger.services.inserts import one_statement_pair
from ledger.statements import statement_spelled
from ledger.values import value_for_db

logger = logging.getLogger("ledger.acceptance")

# The receipt's columns, each read from the UPDATE's RETURNING (the row as written, under its
# lock). `payload` is the stored result; `audit` and `accepted_at` are the statement's own values.
_RECEIPT_FROM_ROW = {
    "operation_id": "id", "tenant": "tenant", "call_node_id": "call_node_id",
    "execution_epoch": "execution_epoch", "terminal_status": "terminal_status",
    "request_digest": "request_digest", "remote_id": "remote_id",
    "descriptor_version": "descriptor_version", "cancel_generation": "cancel_generation",
    "result_digest": "result_digest", "payload": "result",
}
_RECEIPT_OWN = ("audit", "accepted_at")
# The outbox payload's keys and the row's columns they come from (the step-by-step acceptance
# builds the same object in Python; jsonb keeps no key order, so the stored values are equal).
_OUTBOX_FROM_ROW = {"call_node_id": "call_node_id", "execution_epoch": "execution_epoch",
                    "terminal_status": "terminal_status", "result_digest": "result_digest",
                    "payload": "result"}
_EVENT_FROM_ROW = {"operation_id": "id", "server_state": "server_state",
                   "execution_epoch": "execution_epoch", "cancel_generation": "cancel_generation"}
_EVENT_OWN = ("kind", "from_state", "to_state", "data")
_RETURNING = tuple(dict.fromkeys([*_RECEIPT_FROM_ROW.values(), *_OUTBOX_FROM_ROW.values(),
                                  *_EVENT_FROM_ROW.values()]))


def _columns_checked() -> None:
    """The spelling below names every column of the three rows; a model change must show here."""
    receipt = {f.attname for f in TerminalReceipt._meta.concrete_fields} - {"id"}
    if receipt != {*_RECEIPT_FROM_ROW, *_RECEIPT_OWN}:
        raise RuntimeError("the receipt model's columns changed: update this module")
    events = {f.attname for f in event_columns()}
    if events != {*_EVENT_FROM_ROW, *_EVENT_OWN, "created_at"}:
        raise RuntimeError("the event model's columns changed: update this module")


def operation_accept_terminal_one_statement(
    *,
    operation_id: uuid.UUID,
    from_state: str,
    lease_owner: str,
    execution_epoch: int,
    cancel_generation: int,
    call_node_id: str,
    request_digest: str,
    remote_id: str,
    descriptor_version: str,
    execution_mode: str,
    fields: Mapping[str, Any],
    events: Sequence[EventSpec],
    accepted_data: Mapping[str, Any],
) -> int | None:
    """Write `fields` (the final state among them) to the row, with its receipt, its one outbox
    row, `events` and the `accepted` event (whose data gets the receipt's key as `receipt_id`):
    the receipt's key, or None when nothing was written (see the module docstring).

    The row must still be as the claim says: in `from_state` under `lease_owner`'s lease, and
    every field the step-by-step acceptance checks against the locked row (epoch, cancel
    generation, call node, request digest, remote id unless `fields` writes it, descriptor
    version) equal to the claim's; it must be a non-shadow row of `execution_mode` without input
    rounds, whose acceptance writes nothing but these rows. `events[-1]` is the `accepted`
    event, `accepted_data` merged in. The caller decides the way (operation_transition_path's
    hops, checked against the state table).
    """
    # Acceptance's identity checks, as guards of the UPDATE: they hold for the row under the
    # lock that UPDATE takes, as they would against a select_for_update.
    guards: dict[str, Any] = {
        "id": operation_id, "state": from_state, "execution_epoch": execution_epoch,
        "lease_owner": lease_owner, "cancel_generation": cancel_generation,
        "call_node_id": call_node_id, "request_digest": request_digest,
        "descriptor_version": descriptor_version, "shadow": False, "input_round": 0,
        "execution_mode": execution_mode,
    }
    if "remote_id" not in fields:
        guards["remote_id"] = remote_id
    connection = one_statement_pair(TerminalReceipt, OutboxEvent)
    if (connection is None or connection.in_atomic_block or not connection.get_autocommit()
            or not guarded_update_direct(guards=guards, fields=fields)):
        return None
    if not events or events[-1].kind != "accepted":
        raise ValueError("the accepted event comes last")
    update_sql, params = guarded_update_statement(connection=connection, guards=guards,
                                                  fields=fields, returning=_RETURNING)
    now = fields["updated_at"]
    receipt_fields = {f.attname: f for f in TerminalReceipt._meta.concrete_fields}
    params += [value_for_db(receipt_fields["audit"], {}, connection),
               value_for_db(receipt_fields["accepted_at"], now, connection)]
    outbox = OutboxEvent(payload={})
    outbox_columns = [f for f in OutboxEvent._meta.concrete_fields
                      if f.attname not in ("id", "receipt_id", "payload")]
    params += [value_for_db(f, f.pre_save(outbox, True), connection) for f in outbox_columns]
    # The events' own values travel as one JSON array (one parameter, whatever their number):
    # psycopg keeps the parsed form of a statement of at most 50 parameters only.
    last = len(events)
    own = [{"kind": e.kind, "from_state": str(e.from_state), "to_state": str(e.to_state),
            "data": {**(e.data or {}), **(accepted_data if rank == last else {})}, "rank": rank}
           for rank, e in enumerate(events, start=1)]
    created_field = OperationEvent._meta.get_field("created_at")
    encoder = OperationEvent._meta.get_field("data").encoder  # type: ignore[union-attr]
    params += [json.dumps(own, cls=encoder), value_for_db(created_field, now, connection),
               OperationEvent._meta.get_field("operation").get_db_prep_value(operation_id, connection)]

    def spell() -> str:
        _columns_checked()
        qn = connection.ops.quote_name
        receipt_cols = [f.column for f in TerminalReceipt._meta.concrete_fields if f.attname != "id"]
        receipt_values = [f"u.{qn(_RECEIPT_FROM_ROW[f.attname])}" if f.attname in _RECEIPT_FROM_ROW
                          else "%s" for f in TerminalReceipt._meta.concrete_fields
                          if f.attname != "id"]
        # The two own values are sent in _RECEIPT_OWN order; the model's order may differ.
        own_order = [f.attname for f in TerminalReceipt._meta.concrete_fields
                     if f.attname in _RECEIPT_OWN]
        if own_order != list(_RECEIPT_OWN):
            raise RuntimeError("the receipt's own columns changed order: update this module")
        payload = ", ".join(f"'{key}', u.{qn(col)}" for key, col in _OUTBOX_FROM_ROW.items())
        outbox_sql = (
            f"INSERT INTO {qn(OutboxEvent._meta.db_table)} ({qn('receipt_id')}, {qn('payload')}, "
            f"{', '.join(qn(f.column) for f in outbox_columns)}) "
            f"SELECT r.{qn('id')}, jsonb_build_object('operation_id', u.{qn('id')}::text, {payload}, "
            f"'receipt_id', r.{qn('id')}), {', '.join(['%s'] * len(outbox_columns))} "
            f"FROM r CROSS JOIN u RETURNING {qn('receipt_id')}")
        event_table = qn(OperationEvent._meta.db_table)
        picked = {name: f"u.{qn(col)}" for name, col in _EVENT_FROM_ROW.items()}
        picked.update({name: f"v.{name}" for name in _EVENT_OWN})
        picked["data"] = (f"CASE WHEN v.rank = {last} THEN v.data || jsonb_build_object("
                          f"'receipt_id', r.{qn('id')}) ELSE v.data END")
        picked["created_at"] = "c.at"
        columns = event_columns()
        events_sql = (
            f"INSERT INTO {event_table} ({', '.join(qn(f.column) for f in columns)}, {qn('seq')}) "
            f"SELECT {', '.join(picked[f.attname] for f in columns)}, m.top + v.rank "
            f"FROM jsonb_to_recordset(%s::jsonb) AS v(kind text, from_state text, to_state text, "
            f"data jsonb, rank integer) CROSS JOIN (SELECT %s::timestamptz AS at) AS c "
            f"CROSS JOIN (SELECT COALESCE(MAX({qn('seq')}), 0) AS top FROM {event_table} "
            f"WHERE {qn('operation_id')} = %s) AS m CROSS JOIN u CROSS JOIN r")
        return (
            f"WITH u AS ({update_sql}), "
            f"r AS (INSERT INTO {qn(TerminalReceipt._meta.db_table)} "
            f"({', '.join(qn(c) for c in receipt_cols)}) SELECT {', '.join(receipt_values)} FROM u "
            f"RETURNING {qn('id')}), "
            f"o AS ({outbox_sql}), e AS ({events_sql}) SELECT {qn('receipt_id')} FROM o")

    sql = statement_spelled(site="accept_terminal_one_statement",
                            shape=(connection.alias, update_sql, last), spell=spell)
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
    except IntegrityError as exc:
        # A taken receipt slot, a missed event, a remote id another row holds: nothing was
        # written (the statement is its own transaction); the step-by-step path decides.
        logger.info("one-statement acceptance refused for %s: %s", operation_id,
                    getattr(getattr(exc.__cause__, "diag", None), "constraint_name", "") or "integrity")
        return None
    return None if row is None else int(row[0])
