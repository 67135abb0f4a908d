"""The reconciliation queue services: opening, the four resolutions, races, the gate figure, CLI."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, connections, transaction
from django.test import override_settings
from django.utils import timezone

from ledger.models import Operation, OperationEvent, ReconciliationItem, TerminalReceipt
from ledger.selectors.reconciliation import (
    reconciliation_items_open,
    reconciliation_oldest_open_age_seconds,
    reconciliation_overdue_count,
)
from ledger.states import State
from tests.ledger.factories import OperationFactory
from toolops.services.reconcile import (
    AlreadyResolved,
    ReconciliationRefused,
    operation_to_reconciliation,
    reconciliation_abandon,
    reconciliation_accept_terminal,
    reconciliation_attach_remote_id,
    reconciliation_declare_never_created,
    reconciliation_resolve,
)


def _open_item(**op_fields: Any) -> ReconciliationItem:
    op = OperationFactory(**op_fields)
    return operation_to_reconciliation(op=op, lease_owner=None, reason="not_found_unknown",
                                       evidence={"classification": "UNKNOWN", "error": "-32602"})


@pytest.mark.django_db
@override_settings(TOOLOPS_RECONCILIATION_DEADLINE_SECONDS=60)
def test_opening_moves_the_row_and_records_reason_evidence_and_deadline() -> None:
    item = _open_item(server_state="working")
    op = Operation.objects.get(id=item.operation_id)
    assert op.state == State.RECONCILIATION_REQUIRED and op.next_poll_at is None
    assert item.status == "open" and item.reason == "not_found_unknown" and item.owner is None
    assert timedelta(seconds=59) < item.deadline - timezone.now() <= timedelta(seconds=60)
    assert item.evidence["detail"]["error"] == "-32602"
    assert item.evidence["server_state"] == "working"
    assert item.evidence["remote_id"] == op.remote_id
    assert item.evidence["submission_key"] == op.submission_key
    # The row's recent history, up to and including the move into the queue.
    assert [e["kind"] for e in item.evidence["events"]] == ["reconciliation_required"]
    assert OperationEvent.objects.filter(operation=op, kind="reconciliation_required").count() == 1


@pytest.mark.django_db
def test_one_open_item_per_operation() -> None:
    item = _open_item()
    with pytest.raises(IntegrityError), transaction.atomic():
        ReconciliationItem.objects.create(operation_id=item.operation_id, reason="again",
                                          deadline=timezone.now())


@pytest.mark.django_db
def test_attach_remote_id_resumes_polling_and_records_who_and_why() -> None:
    item = _open_item(remote_id="")
    resolved = reconciliation_attach_remote_id(item_id=item.id, remote_id="task-found",
                                               actor="alice", reason="found in server logs")
    assert resolved.status == "resolved" and resolved.resolution == "attach_remote_id"
    assert resolved.resolved_by == "alice" and resolved.resolution_reason == "found in server logs"
    op = Operation.objects.get(id=item.operation_id)
    assert op.state == State.WORKING and op.remote_id == "task-found"
    assert op.next_poll_at is not None and op.next_poll_at <= timezone.now()
    event = OperationEvent.objects.get(operation=op, kind="reconciliation_resolved")
    assert event.data["by"] == "alice" and event.data["reason"] == "found in server logs"
    with pytest.raises(AlreadyResolved):
        reconciliation_abandon(item_id=item.id, actor="bob", reason="changed my mind")
    assert Operation.objects.get(id=op.id).state == State.WORKING


@pytest.mark.django_db
def test_attach_refuses_a_remote_id_owned_by_another_operation() -> None:
    item = _open_item(remote_id="")
    OperationFactory(server=item.operation.server, remote_id="task-taken")
    with pytest.raises(ReconciliationRefused, match="another operation"):
        reconciliation_attach_remote_id(item_id=item.id, remote_id="task-taken", actor="a", reason="r")
    assert ReconciliationItem.objects.get(id=item.id).status == "open"


@pytest.mark.django_db
def test_never_created_is_refused_when_a_task_id_is_known() -> None:
    item = _open_item(remote_id="task-7")
    with pytest.raises(ReconciliationRefused, match="it was created"):
        reconciliation_declare_never_created(item_id=item.id, actor="a", reason="looks gone")
    assert Operation.objects.get(id=item.operation_id).state == State.RECONCILIATION_REQUIRED


@pytest.mark.django_db
def test_never_created_frees_the_call_node_and_abandoned_does_not() -> None:
    item = _open_item(remote_id="", call_node_id="node-free")
    reconciliation_declare_never_created(item_id=item.id, actor="a", reason="server owner confirmed")
    assert Operation.objects.get(id=item.operation_id).state == State.NOT_FOUND_SAFE
    OperationFactory(call_node_id="node-free")  # a new attempt may exist now

    kept = _open_item(remote_id="", call_node_id="node-kept")
    reconciliation_abandon(item_id=kept.id, actor="a", reason="tool retired")
    assert Operation.objects.get(id=kept.operation_id).state == State.ABANDONED
    with pytest.raises(IntegrityError), transaction.atomic():
        OperationFactory(call_node_id="node-kept")


@pytest.mark.django_db
def test_accept_terminal_with_evidence_goes_through_the_acceptance_point() -> None:
    item = _open_item()
    reconciliation_accept_terminal(item_id=item.id, terminal_status="completed",
                                   evidence={"content": [{"type": "text", "text": "seen by hand"}]},
                                   actor="carol", reason="server UI shows completed")
    op = Operation.objects.get(id=item.operation_id)
    assert op.state == State.ACCEPTED and op.result_digest.startswith("sha256:")
    receipt = TerminalReceipt.objects.get(operation=op)
    assert receipt.terminal_status == "completed" and receipt.result_digest == op.result_digest
    assert op.result["attested_by"] == "carol"


@pytest.mark.django_db
def test_accept_terminal_without_any_result_is_refused() -> None:
    item = _open_item()
    with pytest.raises(ReconciliationRefused, match="evidence"):
        reconciliation_accept_terminal(item_id=item.id, terminal_status="completed", evidence=None,
                                       actor="carol", reason="trust me")
    with pytest.raises(ReconciliationRefused, match="terminal status"):
        reconciliation_accept_terminal(item_id=item.id, terminal_status="done", evidence={"x": 1},
                                       actor="carol", reason="r")
    assert not TerminalReceipt.objects.exists()


@pytest.mark.django_db
def test_who_and_why_are_required() -> None:
    item = _open_item()
    with pytest.raises(ReconciliationRefused, match="why"):
        reconciliation_abandon(item_id=item.id, actor="a", reason="  ")
    with pytest.raises(ReconciliationRefused, match="who"):
        reconciliation_abandon(item_id=item.id, actor="", reason="r")
    with pytest.raises(ReconciliationRefused, match="unknown action"):
        reconciliation_resolve(item_id=item.id, action="delete", actor="a", reason="r")
    assert ReconciliationItem.objects.get(id=item.id).status == "open"


def _race(n: int, fns: list[Callable[[], Any]]) -> tuple[list[Any], list[BaseException]]:
    barrier = threading.Barrier(n)
    results: list[Any] = []
    errors: list[BaseException] = []

    def run(fn: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            results.append(fn())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(fn,)) for fn in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


@pytest.mark.django_db(transaction=True)
def test_concurrent_resolutions_of_one_item_one_wins() -> None:
    item = _open_item(remote_id="")
    fns: list[Callable[[], Any]] = [
        lambda: reconciliation_attach_remote_id(item_id=item.id, remote_id="t-1", actor="u1", reason="a"),
        lambda: reconciliation_declare_never_created(item_id=item.id, actor="u2", reason="b"),
        lambda: reconciliation_abandon(item_id=item.id, actor="u3", reason="c"),
        lambda: reconciliation_attach_remote_id(item_id=item.id, remote_id="t-2", actor="u4", reason="d"),
    ]
    results, errors = _race(len(fns), fns)
    assert len(results) == 1 and len(errors) == 3
    assert all(isinstance(e, AlreadyResolved) for e in errors), errors
    item.refresh_from_db()
    assert item.status == "resolved" and item.resolved_by == results[0].resolved_by
    op = Operation.objects.get(id=item.operation_id)
    expected = {"attach_remote_id": State.WORKING, "never_created": State.NOT_FOUND_SAFE,
                "abandoned": State.ABANDONED}[item.resolution]
    assert op.state == expected
    assert OperationEvent.objects.filter(operation=op, kind="reconciliation_resolved").count() == 1


@pytest.mark.django_db
def test_gate_figures_oldest_open_age_and_overdue() -> None:
    assert reconciliation_oldest_open_age_seconds() is None
    old = _open_item()
    _open_item()
    ReconciliationItem.objects.filter(id=old.id).update(
        created_at=timezone.now() - timedelta(minutes=20), deadline=timezone.now() - timedelta(minutes=5))
    age = reconciliation_oldest_open_age_seconds()
    assert age is not None and 1190 < age < 1260
    assert reconciliation_overdue_count() == 1
    assert [i.id for i in reconciliation_items_open(overdue_only=True)] == [old.id]
    reconciliation_abandon(item_id=old.id, actor="a", reason="r")
    age = reconciliation_oldest_open_age_seconds()
    assert age is not None and age < 60 and reconciliation_overdue_count() == 0


@pytest.mark.django_db
def test_cli_lists_and_resolves() -> None:
    item = _open_item(remote_id="")
    out = StringIO()
    call_command("toolops", "reconcile", "--list", stdout=out)
    listed = json.loads(out.getvalue())
    assert [row["item"] for row in listed] == [item.id]
    assert listed[0]["submission_key"] == Operation.objects.get(id=item.operation_id).submission_key
    out = StringIO()
    call_command("toolops", "reconcile", "--resolve", str(item.id), "--action", "attach_remote_id",
                 "--remote-id", "t-cli", "--reason", "found it", "--actor", "dave", stdout=out)
    assert json.loads(out.getvalue())["resolved_by"] == "dave"
    with pytest.raises(CommandError, match="already resolved"):
        call_command("toolops", "reconcile", "--resolve", str(item.id), "--action", "abandoned",
                     "--reason", "again", stdout=StringIO())
    out = StringIO()
    call_command("toolops", "reconcile", "--list", stdout=out)
    assert json.loads(out.getvalue()) == []


@pytest.mark.django_db
def test_show_finds_unknown_rows_by_submission_key_or_remote_id() -> None:
    unknown = OperationFactory(state=State.SUBMISSION_UNKNOWN, remote_id="")
    item = _open_item(remote_id="task-404")
    for ref, expected in ((unknown.submission_key, unknown.id), ("task-404", item.operation_id)):
        out = StringIO()
        call_command("toolops", "show", ref, stdout=out)
        assert json.loads(out.getvalue())["id"] == str(expected)
