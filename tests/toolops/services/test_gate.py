"""The gate report: each figure on a hand-built ledger (PostgreSQL), pass and fail, and the CLI's
exit code."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.models import (
    InputRequest,
    Operation,
    OperationEvent,
    OutboxEvent,
    ReconciliationItem,
    TerminalReceipt,
)
from ledger.states import State
from tests.ledger.factories import OperationFactory, ToolServerFactory
from toolops.qps import LocalTokenBucket, qps_bucket_replace, server_bucket_key
from toolops.services.gate import gate_report, percentile

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _local_bucket() -> Iterator[LocalTokenBucket]:
    bucket = LocalTokenBucket()
    qps_bucket_replace(bucket)
    yield bucket
    qps_bucket_replace(None)


def _event(op: Operation, seq: int, kind: str, *, src: str = "", dst: str = "", server_state: str = "",
           data: dict[str, Any] | None = None, at_offset_s: float = 0.0) -> OperationEvent:
    ev = OperationEvent.objects.create(operation=op, seq=seq, kind=kind, from_state=src, to_state=dst,
                                       server_state=server_state, execution_epoch=op.execution_epoch,
                                       cancel_generation=op.cancel_generation, data=data or {})
    if at_offset_s:
        OperationEvent.objects.filter(pk=ev.pk).update(
            created_at=ev.created_at + timedelta(seconds=at_offset_s))
    return ev


def _accepted(op: Operation, *, status: str, seen: str | None, final: str = State.ACCEPTED,
              cancel_ms: float | None = None) -> TerminalReceipt:
    if seen:
        _event(op, 1, "terminal_observed", src=State.WORKING, dst=State.TERMINAL_OBSERVED, server_state=seen)
    data: dict[str, Any] = {"terminal_status": status}
    if cancel_ms is not None:
        data.update(cancel_confirmation_ms=cancel_ms,
                    cancel_outcome="won" if status == "cancelled" else "lost")
    receipt = TerminalReceipt.objects.create(
        operation=op, call_node_id=op.call_node_id, execution_epoch=op.execution_epoch,
        terminal_status=status, request_digest=op.request_digest, remote_id=op.remote_id,
        descriptor_version=op.descriptor_version, cancel_generation=op.cancel_generation)
    OutboxEvent.objects.create(receipt=receipt, payload={
        "receipt_id": receipt.pk, "operation_id": str(op.id), "call_node_id": op.call_node_id,
        "execution_epoch": op.execution_epoch, "terminal_status": status})
    _event(op, 2, "accepted", src=State.FETCHING_RESULT, dst=final, data=data)
    Operation.objects.filter(pk=op.pk).update(state=final, terminal_status=status)
    return receipt


def test_clean_ledger_passes_every_figure() -> None:
    _accepted(OperationFactory(), status="completed", seen="completed")
    report = gate_report()
    assert report.passed, report.as_dict()
    assert len(report.figures) == 8
    assert report.figure("outbox_traceable_share").value == 1.0


def test_divergence_from_ledger_events_and_confirmed_cancel_exemption() -> None:
    _accepted(OperationFactory(), status="completed", seen="failed")
    # A confirmed cancel whose last observation before acceptance said "working" is not divergent.
    _accepted(OperationFactory(cancel_generation=1), status="cancelled", seen=None,
              final=State.CANCELLED_ACCEPTED)
    fig = gate_report().figure("terminal_divergence")
    assert (fig.value, fig.passed) == (1, False)
    assert fig.detail["confirmed_cancels_exempt"] == 1
    assert fig.detail["sample"][0]["last_server_status"] == "failed"


def test_divergence_against_ground_truth_and_unsettled() -> None:
    a = OperationFactory()
    _accepted(a, status="completed", seen="completed")
    assert gate_report(ground_truth={a.submission_key: "completed"}).figure("terminal_divergence").passed
    fig = gate_report(ground_truth={a.submission_key: "cancelled"}).figure("terminal_divergence")
    assert (fig.value, fig.passed) == (1, False)
    fig = gate_report(ground_truth={a.submission_key: "completed", "k-never": "failed"}).figure(
        "terminal_divergence")
    assert (fig.value, fig.detail["unsettled"]) == (1, 1)


def test_duplicate_operations_shared_remote_id_and_peer_counts() -> None:
    server = ToolServerFactory()
    a = OperationFactory(server=server, remote_id="t-1")
    assert gate_report().figure("duplicate_operations").passed
    assert not gate_report(peer_counts={a.submission_key: 2}).figure("duplicate_operations").passed
    # A second row with the same (server, remote id) cannot exist any more
    # (op_one_operation_per_remote_task); the gate figure stays as the backstop for peer counts.
    with pytest.raises(IntegrityError, match="op_one_operation_per_remote_task"), \
            transaction.atomic():
        OperationFactory(server=server, remote_id="t-1")
    assert gate_report().figure("duplicate_operations").detail["shared_remote_ids"] == 0


def test_poll_rate_reads_the_bucket_peak(_local_bucket: LocalTokenBucket) -> None:
    server = ToolServerFactory(max_qps=2.0)
    OperationFactory(server=server)
    key = server_bucket_key(server_id=server.pk)
    _local_bucket.take(key=key, rate=2.0, purpose="poll")
    fig = gate_report().figure("poll_rate_over_qps")
    assert fig.passed and fig.value == 0.5
    # Three grants in one second against a cap of two: the bucket's own counters say so.
    with _local_bucket._lock:
        _local_bucket._buckets[key] = (5.0, _local_bucket._buckets[key][1])
    _local_bucket.take(key=key, rate=2.0, purpose="poll")
    _local_bucket.take(key=key, rate=2.0, purpose="poll")
    fig = gate_report().figure("poll_rate_over_qps")
    if fig.detail["worst"]["peak_requests_in_one_second"] >= 3:  # same wall second (almost always)
        assert not fig.passed and fig.value == 1.5


def test_percentile_nearest_rank() -> None:
    assert percentile([], 99) is None
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert percentile([1.0, 2.0], 99) == 2.0


def test_cancel_confirmation_p99() -> None:
    for i in range(99):
        _accepted(OperationFactory(cancel_generation=1), status="cancelled", seen=None,
                  final=State.CANCELLED_ACCEPTED, cancel_ms=1000.0 + i)
    assert gate_report().figure("cancel_confirmation_p99_ms").passed
    _accepted(OperationFactory(cancel_generation=1), status="completed", seen="completed",
              cancel_ms=120_000.0)
    _accepted(OperationFactory(cancel_generation=1), status="completed", seen="completed",
              cancel_ms=90_000.0)
    fig = gate_report().figure("cancel_confirmation_p99_ms")
    assert (fig.value, fig.passed, fig.detail["cancels"]) == (90_000.0, False, 101)


def test_operator_settled_cancels_are_listed_apart_from_confirmation_latency() -> None:
    for i in range(10):
        _accepted(OperationFactory(cancel_generation=1), status="cancelled", seen=None,
                  final=State.CANCELLED_ACCEPTED, cancel_ms=1000.0 + i)
    # The server lost the task; an operator settled it from the queue two minutes later.
    op = OperationFactory(cancel_generation=1)
    _accepted(op, status="completed", seen=None, cancel_ms=120_000.0)
    OperationEvent.objects.filter(operation=op, kind="accepted").update(
        data={"terminal_status": "completed", "cancel_confirmation_ms": 120_000.0,
              "cancel_outcome": "lost", "settled_by": "operator"})
    fig = gate_report().figure("cancel_confirmation_p99_ms")
    assert (fig.value, fig.passed, fig.detail["cancels"]) == (1009.0, True, 10)
    assert fig.detail["settled_by_operator"] == 1
    assert fig.detail["settled_by_operator_max_ms"] == 120_000.0


def test_unknown_spells_closed_and_open() -> None:
    op = OperationFactory(state=State.WORKING)
    _event(op, 1, "submission_unknown", src=State.SUBMITTING, dst=State.SUBMISSION_UNKNOWN)
    _event(op, 2, "submission_resolved", src=State.SUBMISSION_UNKNOWN, dst=State.WORKING, at_offset_s=600)
    fig = gate_report().figure("unknown_resolved_or_queued_s")
    assert fig.passed and 599 < fig.value < 601
    late = OperationFactory(state=State.SUBMISSION_UNKNOWN)
    _event(late, 1, "submission_unknown", src=State.SUBMITTING, dst=State.SUBMISSION_UNKNOWN)
    fig = gate_report(now=timezone.now() + timedelta(minutes=16)).figure("unknown_resolved_or_queued_s")
    assert not fig.passed and fig.detail["still_unknown"] == 1
    assert fig.detail["longest_operation_id"] == str(late.id)


def test_outbox_row_that_disagrees_with_its_receipt_is_untraceable() -> None:
    receipt = _accepted(OperationFactory(), status="completed", seen="completed")
    OutboxEvent.objects.filter(receipt=receipt).update(payload={"receipt_id": receipt.pk})
    fig = gate_report().figure("outbox_traceable_share")
    assert (fig.value, fig.passed, fig.detail["untraceable"]) == (0.0, False, 1)


def test_command_exit_codes_and_json() -> None:
    receipt = _accepted(OperationFactory(), status="completed", seen="completed")
    out = StringIO()
    call_command("toolops", "gate", "--json", stdout=out)
    doc = json.loads(out.getvalue())
    assert doc["passed"] is True and len(doc["figures"]) == 8
    OutboxEvent.objects.filter(receipt=receipt).update(payload={})
    out, err = StringIO(), StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("toolops", "gate", stdout=out, stderr=err)
    assert exited.value.code == 1
    assert "FAIL" in out.getvalue() and "outbox_traceable_share" in err.getvalue()


def test_sync_replies_and_operator_attestations_count_as_observations() -> None:
    sync = OperationFactory(execution_mode="sync", remote_id="")
    _event(sync, 1, "sync_result", src=State.SUBMITTING, dst=State.TERMINAL_OBSERVED,
           data={"kind": "error", "is_error": True})
    _accepted(sync, status="failed", seen=None)
    attested = OperationFactory()
    _event(attested, 1, "reconciliation_resolved", src=State.RECONCILIATION_REQUIRED,
           dst=State.TERMINAL_OBSERVED, data={"terminal_status": "completed"})
    _accepted(attested, status="completed", seen=None)
    assert gate_report().figure("terminal_divergence").passed
    lying = OperationFactory(execution_mode="sync", remote_id="")
    _event(lying, 1, "sync_result", src=State.SUBMITTING, dst=State.TERMINAL_OBSERVED,
           data={"kind": "result", "is_error": False})
    _accepted(lying, status="failed", seen=None)
    assert gate_report().figure("terminal_divergence").value == 1


def test_a_polled_row_without_schedule_or_lease_is_refused_by_the_database() -> None:
    op = OperationFactory()
    with pytest.raises(IntegrityError, match="op_open_row_scheduled"), transaction.atomic():
        Operation.objects.filter(pk=op.pk).update(next_poll_at=None, lease_expires_at=None)
    # Leased without a next poll time is allowed: the claim re-claims the lease once it expires.
    Operation.objects.filter(pk=op.pk).update(next_poll_at=None, lease_owner="w",
                                              lease_expires_at=timezone.now())
    assert gate_report().figure("stranded_open_rows").passed


def test_a_row_stranded_on_purpose_fails_the_gate_and_the_command() -> None:
    due = OperationFactory()
    waiting = OperationFactory()
    InputRequest.objects.create(operation=waiting, round=1, server_request_id="r1",
                                method="elicitation/create", schema_digest="sha256:x",
                                deadline=timezone.now() + timedelta(hours=1))
    Operation.objects.filter(pk=waiting.pk).update(state=State.INPUT_REQUIRED, next_poll_at=None)
    queued = OperationFactory()
    ReconciliationItem.objects.create(operation=queued, reason="x",
                                      deadline=timezone.now() + timedelta(hours=1))
    Operation.objects.filter(pk=queued.pk).update(state=State.RECONCILIATION_REQUIRED,
                                                  next_poll_at=None)
    fig = gate_report().figure("stranded_open_rows")
    assert (fig.value, fig.passed) == (0, True), fig.detail
    # Stranded: waiting on input with no round to answer, queued with no item.
    lost_input = OperationFactory()
    Operation.objects.filter(pk=lost_input.pk).update(state=State.INPUT_REQUIRED, next_poll_at=None)
    lost_queue = OperationFactory()
    Operation.objects.filter(pk=lost_queue.pk).update(state=State.RECONCILIATION_REQUIRED,
                                                      next_poll_at=None)
    fig = gate_report().figure("stranded_open_rows")
    assert (fig.value, fig.passed) == (2, False)
    assert {s["operation_id"] for s in fig.detail["sample"]} == {str(lost_input.pk),
                                                                  str(lost_queue.pk)}
    assert str(due.pk) not in json.dumps(fig.detail)
    out, err = StringIO(), StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("toolops", "gate", "--json", stdout=out, stderr=err)
    assert exited.value.code == 1
    doc = json.loads(out.getvalue())
    assert doc["passed"] is False
    assert [f["name"] for f in doc["figures"] if not f["passed"]] == ["stranded_open_rows"]


def test_a_scheduled_row_the_claim_cannot_find_is_stranded() -> None:
    # Its own times say due, but without a due entry no claim walks to it (the triggers that
    # keep ledger_operationdue were lost, say by a table rebuild): stranded, not scheduled.
    from django.db import connection

    op = OperationFactory(next_poll_at=timezone.now())
    assert gate_report().figure("stranded_open_rows").value == 0
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM ledger_operationdue WHERE operation_id = %s", [op.pk])
    fig = gate_report().figure("stranded_open_rows")
    assert (fig.value, fig.passed) == (1, False)
    assert fig.detail["sample"][0]["operation_id"] == str(op.pk)


def test_oldest_overdue_row_counts_due_rows_and_expired_leases() -> None:
    OperationFactory(next_poll_at=timezone.now() + timedelta(seconds=30))
    fig = gate_report().figure("oldest_overdue_row_s")
    assert fig.passed and fig.value == 0.0
    # A lease that ran out ten minutes ago and nobody re-claimed it.
    old = OperationFactory(next_poll_at=None, lease_owner="dead-worker",
                           lease_expires_at=timezone.now() - timedelta(minutes=10))
    fig = gate_report().figure("oldest_overdue_row_s")
    assert not fig.passed and fig.value is not None and fig.value >= 600
    assert fig.detail["operation_id"] == str(old.pk)
    Operation.objects.filter(pk=old.pk).update(lease_expires_at=timezone.now() + timedelta(seconds=5))
    # A due row waiting an hour past its poll time.
    late = OperationFactory(next_poll_at=timezone.now() - timedelta(hours=1))
    fig = gate_report().figure("oldest_overdue_row_s")
    assert not fig.passed and fig.detail["operation_id"] == str(late.pk)
