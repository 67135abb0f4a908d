"""The per-row error boundary, with real failures, the real runner and the reference SDK server.

Database failures are real: a PostgreSQL trigger raises inside the very statement the executor
issues (a data error on one row's writes, a connection-class error on a receipt insert), so the
executor meets exactly what the driver raises when a value does not fit or the server goes away.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.test import override_settings
from django.utils import timezone

from ledger.models import Operation, OperationEvent, ReconciliationItem, TerminalReceipt, ToolServer
from ledger.states import State
from tests.ledger.factories import OperationFactory
from tests.peers.fault_transport import FaultTransport, Rule
from tests.peers.launch import peer_stats
from tests.toolops.helpers import submit_sleep
from toolops import runner
from toolops.services import boundary, db_retry
from toolops.services.connections import adapter_for_server
from toolops.services.dispatch import operations_claim_due
from toolops.services.gate import gate_report
from toolops.services.remote_ids import SubmitReplyUnrecorded
from toolops.services.servers import server_add
from toolops.services.submit import operation_submit

pytestmark = [pytest.mark.django_db(transaction=True),
              # Crashes back off like failed calls; short here so five of them fit in a test.
              pytest.mark.usefixtures("_fast_backoff")]


@pytest.fixture
def _fast_backoff() -> Iterator[None]:
    with override_settings(TOOLOPS_BACKOFF_BASE_SECONDS=0.05, TOOLOPS_BACKOFF_CAP_SECONDS=0.2):
        yield


@pytest.fixture
def server(mcp_url: str) -> ToolServer:
    srv = server_add(name=f"ref-{uuid.uuid4().hex[:6]}", url=mcp_url)
    ToolServer.objects.filter(pk=srv.pk).update(max_qps=1000.0)
    srv.refresh_from_db()
    return srv


@contextmanager
def pg_trigger(*, table: str, when: str, errcode: str, message: str,
               times: int | None = None) -> Iterator[None]:
    """A BEFORE trigger on `table` that raises `errcode` for rows matching `when` (SQL over NEW
    and OLD), at most `times` times (a sequence counts firings: it is not rolled back)."""
    name = f"h13b_fault_{uuid.uuid4().hex[:8]}"
    limit = "" if times is None else f" AND nextval('{name}_seq') <= {times}"
    with connection.cursor() as cur:
        cur.execute(f"CREATE SEQUENCE {name}_seq")
        cur.execute(f"""
            CREATE FUNCTION {name}() RETURNS trigger AS $$
            BEGIN
              IF ({when}){limit} THEN
                RAISE EXCEPTION '{message}' USING ERRCODE = '{errcode}';
              END IF;
              RETURN NEW;
            END $$ LANGUAGE plpgsql""")
        op = "INSERT" if table == "ledger_operationevent" or "OLD." not in when else "UPDATE"
        cur.execute(f"CREATE TRIGGER {name} BEFORE {op} ON {table} FOR EACH ROW "
                    f"EXECUTE FUNCTION {name}()")
    try:
        yield
    finally:
        with connection.cursor() as cur:
            cur.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
            cur.execute(f"DROP FUNCTION IF EXISTS {name}()")
            cur.execute(f"DROP SEQUENCE IF EXISTS {name}_seq")


def _due_now(*ops: Operation) -> None:
    """Due at once, in this order, so one claim takes them all in one batch."""
    base = timezone.now() - timedelta(seconds=10)
    for i, op in enumerate(ops):
        Operation.objects.filter(id=op.id).update(next_poll_at=base + timedelta(seconds=i))


def _spy_batches(monkeypatch: pytest.MonkeyPatch) -> list[list[uuid.UUID]]:
    batches: list[list[uuid.UUID]] = []
    real = runner.operations_claim_due

    def claim(*, owner: str, limit: int | None = None) -> list[uuid.UUID]:
        ids = real(owner=owner, limit=limit)
        if ids:
            batches.append(list(ids))
        return ids

    monkeypatch.setattr(runner, "operations_claim_due", claim)
    return batches


def _crashes(op: Operation) -> list[dict[str, Any]]:
    return list(OperationEvent.objects.filter(operation_id=op.id, kind="executor_error")
                .order_by("seq").values_list("data", flat=True))


def test_a_row_whose_writes_fail_is_queued_and_its_batch_mate_is_accepted(
        server: ToolServer, monkeypatch: pytest.MonkeyPatch) -> None:
    poison, healthy = submit_sleep(server, value="poison"), submit_sleep(server, value="healthy")
    _due_now(poison, healthy)
    batches = _spy_batches(monkeypatch)
    # Every write of the poisoned row's cycle fails with a real DataError (SQLSTATE 22000); the
    # boundary's own record (executor_error, then the queue) is let through.
    with pg_trigger(table="ledger_operationevent", errcode="22000", message="poisoned value",
                    when=f"NEW.operation_id = '{poison.id}' AND NEW.kind NOT IN "
                         "('executor_error', 'reconciliation_required')"):
        stats = runner.run_embedded(until_idle=True, max_seconds=60)
    assert batches[0][:2] == [poison.id, healthy.id]  # one batch, the poisoned row first
    healthy.refresh_from_db()
    poison.refresh_from_db()
    assert healthy.state == State.ACCEPTED
    assert TerminalReceipt.objects.filter(operation=healthy).count() == 1
    assert poison.state == State.RECONCILIATION_REQUIRED
    assert not TerminalReceipt.objects.filter(operation=poison).exists()
    item = ReconciliationItem.objects.get(operation=poison)
    assert item.reason == "executor_error" and item.evidence["detail"]["crashes"] == 5
    crashes = _crashes(poison)
    assert [c["consecutive_crashes"] for c in crashes] == [1, 2, 3, 4, 5]
    assert {c["type"] for c in crashes} == {"django.db.utils.DataError"}
    assert all(c["message"] == "poisoned value" and c["where"] for c in crashes)
    assert stats.outcomes.get("executor_error", 0) == 4
    assert stats.outcomes.get("executor_error_queued", 0) == 1
    report = gate_report(server_names=[server.name])
    assert report.figure("stranded_open_rows").passed and report.passed, report.as_dict()


def test_an_unexpected_exception_is_recorded_redacted_and_the_row_retried(
        server: ToolServer, monkeypatch: pytest.MonkeyPatch) -> None:
    flaky, healthy = submit_sleep(server, value="flaky"), submit_sleep(server, value="fine")
    _due_now(flaky, healthy)
    adapter_cls = type(adapter_for_server(server=server))
    real_get = adapter_cls.get
    secret = "s3cr3t-argument-" + "x" * 60
    failures = {"left": 2}

    def get(self: Any, *, remote_id: str) -> Any:
        if remote_id == flaky.remote_id and failures["left"]:
            failures["left"] -= 1
            raise RecursionError(f"maximum recursion depth exceeded while decoding '{secret}'")
        return real_get(self, remote_id=remote_id)

    monkeypatch.setattr(adapter_cls, "get", get)
    runner.run_embedded(until_idle=True, max_seconds=60)
    flaky.refresh_from_db()
    healthy.refresh_from_db()
    assert (flaky.state, healthy.state) == (State.ACCEPTED, State.ACCEPTED)
    crashes = _crashes(flaky)
    assert [c["type"] for c in crashes] == ["builtins.RecursionError"] * 2
    assert all(c["rescheduled"] for c in crashes)
    # The payload fragment in the message is not recorded, only its length.
    assert all(secret not in str(c) and "<76 chars>" in c["message"] for c in crashes)
    assert peer_stats(server.url)["submission_keys"][flaky.submission_key] == 1


def test_a_stored_result_whose_acceptance_fails_stays_due_and_is_accepted_later(
        server: ToolServer, mcp_url: str) -> None:
    op = submit_sleep(server, value="blip")
    # The receipt insert fails once as if the database went away (SQLSTATE 08006).
    with pg_trigger(table="ledger_terminalreceipt", errcode="08006", message="server closed",
                    when="TRUE", times=1):
        runner.run_embedded(until_idle=True, max_seconds=60)
    op.refresh_from_db()
    assert op.state == State.ACCEPTED
    assert TerminalReceipt.objects.filter(operation=op).count() == 1
    crashes = _crashes(op)
    assert len(crashes) == 1 and crashes[0]["type"] == "django.db.utils.OperationalError"
    assert peer_stats(mcp_url)["submission_keys"][op.submission_key] == 1


def test_a_crash_that_cannot_be_recorded_leaves_the_lease_which_is_reclaimed(
        server: ToolServer, monkeypatch: pytest.MonkeyPatch) -> None:
    op = submit_sleep(server, value="unrecorded")
    _due_now(op)

    def db_down(**_kwargs: Any) -> str:
        raise OperationalError("the database is away")

    def crash(**_kwargs: Any) -> str:
        raise RuntimeError("a bug")

    monkeypatch.setattr("toolops.services.observe.operation_poll", crash)
    monkeypatch.setattr(boundary, "_record_crash", db_down)
    monkeypatch.setattr(db_retry, "RECORD_BACKOFF_SECONDS", (0.01,))
    owner = "test-worker"
    assert operations_claim_due(owner=owner) == [op.id]
    assert boundary.operation_poll_guarded(operation_id=op.id, lease_owner=owner) == \
        "executor_error_unrecorded"
    row = Operation.objects.get(id=op.id)
    assert row.lease_owner == owner and row.lease_expires_at is not None
    assert operations_claim_due(owner="other") == []  # the lease still holds
    # The schedule may be gone too (a cycle that died between two writes): the lease alone is
    # enough for the row to be claimed again once it runs out.
    Operation.objects.filter(id=op.id).update(next_poll_at=None,
                                              lease_expires_at=timezone.now())
    assert operations_claim_due(owner="other") == [op.id]


def test_run_returns_at_its_deadline_and_hands_back_unpolled_rows(
        server: ToolServer, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [OperationFactory(server=server, next_poll_at=timezone.now() - timedelta(seconds=5))
            for _ in range(8)]
    adapter_cls = type(adapter_for_server(server=server))

    def slow_get(self: Any, *, remote_id: str) -> Any:
        time.sleep(0.4)  # a slow server answer, one per row
        raise RuntimeError("slow and then broken")

    monkeypatch.setattr(adapter_cls, "get", slow_get)
    started = time.monotonic()
    stats = runner.run_embedded(until_idle=False, max_seconds=1.0)
    elapsed = time.monotonic() - started
    # Generous slack for a loaded machine, but far below the 8 x 0.4 s a whole batch would take.
    assert elapsed < 1.0 + 0.4 + 1.5, elapsed
    assert 1 <= stats.polls < len(rows)
    untouched = Operation.objects.filter(id__in=[r.id for r in rows], poll_attempts=1).exclude(
        events__kind="executor_error")
    assert untouched.exists()
    assert not untouched.exclude(lease_owner="").exists()  # leases handed back
    assert not untouched.filter(next_poll_at__isnull=True).exists()  # still due


def test_a_failing_claim_makes_the_loop_nap_not_end(
        server: ToolServer, monkeypatch: pytest.MonkeyPatch) -> None:
    op = submit_sleep(server, value="after-blip")
    real = runner.operations_claim_due
    failures = {"left": 2}

    def claim(*, owner: str, limit: int | None = None) -> list[uuid.UUID]:
        if failures["left"]:
            failures["left"] -= 1
            raise OperationalError("connection refused")
        return real(owner=owner, limit=limit)

    monkeypatch.setattr(runner, "operations_claim_due", claim)
    stats = runner.run_embedded(until_idle=True, max_seconds=60)
    op.refresh_from_db()
    assert op.state == State.ACCEPTED and stats.tick_errors == 2


def test_a_second_operation_handed_the_same_remote_id_is_queued(
        server: ToolServer, faults: FaultTransport, mcp_url: str) -> None:
    first = submit_sleep(server, value="first", seconds=0.3)

    def same_task(message: dict[str, Any]) -> dict[str, Any]:
        result = message["result"]
        return {**message, "result": {**result, "task": {**result["task"],
                                                          "taskId": first.remote_id}}}

    faults.script(Rule(action="rewrite", method="tools/call", rewrite=same_task))
    second = submit_sleep(server, value="second", seconds=0.3)
    assert second.state == State.RECONCILIATION_REQUIRED and second.remote_id == ""
    item = ReconciliationItem.objects.get(operation=second)
    assert item.reason == "remote_id_collision"
    assert item.evidence["detail"]["remote_id"] == first.remote_id
    assert item.evidence["detail"]["other_operation_id"] == str(first.id)
    runner.run_embedded(until_idle=True, max_seconds=60)
    first.refresh_from_db()
    assert first.state == State.ACCEPTED  # the first is unaffected
    assert Operation.objects.filter(server=server, remote_id=first.remote_id).count() == 1


def test_a_reply_write_that_fails_for_a_moment_is_retried(server: ToolServer, mcp_url: str) -> None:
    with pg_trigger(table="ledger_operation", errcode="08006", message="server closed",
                    when="NEW.remote_id <> '' AND OLD.remote_id = ''", times=2):
        op = submit_sleep(server, value="retried")
    assert op.state == State.WORKING and op.remote_id
    runner.run_embedded(until_idle=True, max_seconds=60)
    op.refresh_from_db()
    assert op.state == State.ACCEPTED
    assert peer_stats(mcp_url)["submission_keys"][op.submission_key] == 1


def test_a_reply_that_cannot_be_written_raises_a_typed_error_and_keeps_the_remote_id(
        server: ToolServer, mcp_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(db_retry, "RECORD_BACKOFF_SECONDS", (0.05,))
    node = f"eb-{uuid.uuid4().hex[:10]}"
    with pg_trigger(table="ledger_operation", errcode="08006", message="server closed",
                    when="NEW.remote_id <> '' AND OLD.remote_id = ''"), \
            pytest.raises(SubmitReplyUnrecorded, match="accepted the call as task") as raised:
        operation_submit(server_name=server.name, tool_name="sleep_then_complete",
                         call_node_id=node, arguments={"seconds": 0.2, "value": "kept"},
                         ttl_ms=60_000)
    op = Operation.objects.get(call_node_id=node)
    seen = OperationEvent.objects.get(operation=op, kind="remote_id_seen").data["remote_id"]
    assert seen and seen in str(raised.value) and op.state == State.SUBMITTING
    # The submitter's lease runs out; the row is resolved by its key, never sent again.
    Operation.objects.filter(id=op.id).update(lease_expires_at=timezone.now(),
                                              next_poll_at=timezone.now())
    runner.run_embedded(until_idle=True, max_seconds=60)
    op.refresh_from_db()
    assert peer_stats(mcp_url)["submission_keys"][op.submission_key] == 1
    if op.state == State.ACCEPTED:
        assert op.remote_id == seen
    else:
        assert op.state == State.RECONCILIATION_REQUIRED
        assert seen in str(ReconciliationItem.objects.get(operation=op).evidence)


def test_the_celery_poll_task_and_the_path_executor_use_the_boundary(
        server: ToolServer, monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    from toolops.services.executors import executor_run
    from toolops.tasks import poll_operation

    settings.TOOLOPS_EXECUTOR_MAX_CRASHES = 1000  # retried, not queued: the row must come back
    op = submit_sleep(server, value="via-task")
    _due_now(op)

    def crash(**_kwargs: Any) -> str:
        raise KeyError("a bug in one row's cycle")

    monkeypatch.setattr("toolops.services.observe.operation_poll", crash)
    owner = "celery-worker"
    assert operations_claim_due(owner=owner) == [op.id]
    assert poll_operation(str(op.id), owner) == "executor_error"  # the task body, run inline
    row = Operation.objects.get(id=op.id)
    assert row.lease_owner == "" and row.next_poll_at is not None
    _due_now(op)
    stats = executor_run(path="tasks", until_idle=False, max_seconds=1.0)
    assert stats.outcomes.get("executor_error", 0) >= 1
    assert [c["type"] for c in _crashes(op)][:2] == ["builtins.KeyError"] * 2
    monkeypatch.undo()
    runner.run_embedded(until_idle=True, max_seconds=60)
    assert Operation.objects.get(id=op.id).state == State.ACCEPTED


def test_a_stored_result_the_acceptance_point_keeps_refusing_is_queued_not_retried_forever(
        server: ToolServer) -> None:
    from ledger.digests import canonical_digest

    stored = {"kind": "result", "payload": {"content": []}, "is_error": False,
              "status_message": ""}
    op = OperationFactory(server=server, state=State.FETCHING_RESULT, terminal_status="completed",
                          result=stored, result_kind="result", result_digest=canonical_digest(stored),
                          next_poll_at=timezone.now() - timedelta(seconds=1))
    # A receipt already holds this row's slot: every acceptance is refused (IntegrityError inside).
    TerminalReceipt.objects.create(
        operation=op, call_node_id=op.call_node_id, execution_epoch=op.execution_epoch,
        terminal_status="completed", request_digest=op.request_digest, remote_id=op.remote_id,
        descriptor_version=op.descriptor_version, cancel_generation=op.cancel_generation,
        result_digest=op.result_digest)
    stats = runner.run_embedded(until_idle=True, max_seconds=60)
    op.refresh_from_db()
    assert op.state == State.RECONCILIATION_REQUIRED
    assert ReconciliationItem.objects.get(operation=op).reason == "executor_error"
    assert stats.outcomes == {"acceptance_refused": 4, "acceptance_refused_queued": 1}
    assert OperationEvent.objects.filter(operation=op, kind="acceptance_refused").count() == 5
