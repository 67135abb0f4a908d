"""Tool output defense: the pipeline's checks, and both policies end to end against the real peer."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from ledger.models import Operation, OutboxEvent, TerminalReceipt, ToolServer
from ledger.selectors import operation_snapshot
from ledger.states import State
from tests.ledger.factories import OperationFactory, ToolServerFactory
from toolops.runner import run_embedded
from toolops.services.output_defense import result_defend
from toolops.services.submit import operation_submit

pytestmark = pytest.mark.django_db

VALUE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {"value": {"type": "string", "pattern": "^[a-z]+$"}},
    "required": ["value"],
    "additionalProperties": False,
}


def _op_with_schema(schema: dict[str, Any] | None) -> Operation:
    descriptor: dict[str, Any] = {"name": "render"}
    if schema is not None:
        descriptor["outputSchema"] = schema
    server = ToolServerFactory(tools={"render": {"task_support": "required", "descriptor_digest": "sha256:d1",
                                                 "descriptor": descriptor}})
    return OperationFactory(server=server)


def _stored(payload: Any, *, kind: str = "result", is_error: bool = False) -> dict[str, Any]:
    return {"kind": kind, "payload": payload, "is_error": is_error, "status_message": ""}


def _text(text: str, structured: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if structured is not None:
        out["structuredContent"] = structured
    return out


def test_output_schema_is_enforced_on_successful_results() -> None:
    op = _op_with_schema(VALUE_SCHEMA)
    assert result_defend(op=op, stored=_stored(_text("teal", {"value": "teal"})),
                         terminal_status="completed").ok
    bad = result_defend(op=op, stored=_stored(_text("x", {"value": "Teal-42"})), terminal_status="completed")
    assert not bad.ok
    assert "structuredContent['value']" in bad.reasons[0] and "does not match" in bad.reasons[0]
    extra = result_defend(op=op, stored=_stored(_text("x", {"value": "a", "leak": 1})),
                          terminal_status="completed")
    assert "Additional properties are not allowed" in extra.reasons[0]
    missing = result_defend(op=op, stored=_stored(_text("x")), terminal_status="completed")
    assert missing.reasons == ["tool declares an outputSchema but the result has no structuredContent"]
    # A tool error is reported in content and is not held to the success schema.
    assert result_defend(op=op, stored=_stored(_text("boom"), is_error=True), terminal_status="completed").ok
    # Without a declared schema, structured content is not checked.
    assert result_defend(op=_op_with_schema(None), stored=_stored(_text("x", {"any": 1})),
                         terminal_status="completed").ok


def test_an_invalid_declared_schema_rejects_rather_than_passes() -> None:
    op = _op_with_schema({"type": "not-a-type"})
    verdict = result_defend(op=op, stored=_stored(_text("x", {"value": "a"})), terminal_status="completed")
    assert len(verdict.reasons) == 1 and verdict.reasons[0].startswith("the tool's outputSchema is invalid")


def test_size_cap_and_allowed_content_types() -> None:
    op = _op_with_schema(None)
    with override_settings(TOOLOPS_OUTPUT_MAX_BYTES=100):
        big = result_defend(op=op, stored=_stored(_text("y" * 200)), terminal_status="completed")
        assert len(big.reasons) == 1 and "over the 100 byte cap" in big.reasons[0]
        assert result_defend(op=op, stored=_stored(_text("y" * 10)), terminal_status="completed").ok
    weird = {"content": [{"type": "text", "text": "a"}, {"type": "script", "src": "x"}, "junk"]}
    verdict = result_defend(op=op, stored=_stored(weird), terminal_status="completed")
    assert len(verdict.reasons) == 2
    assert "content[1] has type 'script'" in verdict.reasons[0] and "content[2]" in verdict.reasons[1]
    with override_settings(TOOLOPS_OUTPUT_ALLOWED_CONTENT_TYPES=["image"]):
        assert not result_defend(op=op, stored=_stored(_text("a")), terminal_status="completed").ok
    # Failed results are still size- and type-checked (their text reaches a user too).
    assert not result_defend(op=op, stored=_stored(weird, kind="error", is_error=True),
                             terminal_status="failed").ok
    # A cancelled outcome carries no accepted payload: nothing to check.
    assert result_defend(op=op, stored=_stored(weird), terminal_status="cancelled").ok


def forbid_word(*, operation: Operation, result: dict[str, Any]) -> list[str]:
    texts = [b.get("text", "") for b in result["payload"].get("content", [])]
    return [f"forbidden word in {operation.tool_name} output"] if any("forbidden" in t for t in texts) else []


def test_custom_hooks_by_dotted_path() -> None:
    op = _op_with_schema(None)
    hook = "tests.toolops.services.test_output_defense.forbid_word"
    with override_settings(TOOLOPS_OUTPUT_VALIDATORS=[hook]):
        assert result_defend(op=op, stored=_stored(_text("fine")), terminal_status="completed").ok
        verdict = result_defend(op=op, stored=_stored(_text("a forbidden thing")),
                                terminal_status="completed")
        assert verdict.reasons == ["forbidden word in render output"]


# --- end to end over real HTTP ---


@pytest.fixture
def server_options() -> dict[str, Any]:
    return {"sync_bounds": {"quick_sync": 5.0}}


@pytest.fixture
def server(server: ToolServer) -> ToolServer:
    # The peer's tools declare no outputSchema; record one in the negotiated descriptor exactly as
    # a server that declared it would have had it recorded. The results themselves are real.
    tools = dict(server.tools)
    tools["sleep_then_complete"]["descriptor"]["outputSchema"] = VALUE_SCHEMA
    ToolServer.objects.filter(pk=server.pk).update(tools=tools)
    return ToolServer.objects.get(pk=server.pk)


def _run(server: ToolServer, node: str, value: str) -> dict[str, Any]:
    op = operation_submit(server_name=server.name, tool_name="sleep_then_complete", call_node_id=node,
                          arguments={"seconds": 0.2, "value": value}, ttl_ms=60_000)
    run_embedded(until_idle=True, max_seconds=30)
    return operation_snapshot(operation_id=op.id)


def test_valid_result_is_accepted(server: ToolServer) -> None:
    snap = _run(server, "n-ok", "teal")
    assert snap["state"] == State.ACCEPTED and snap["receipt"]["terminal_status"] == "completed"


def test_rejected_result_goes_to_reconciliation_with_its_reasons(server: ToolServer) -> None:
    snap = _run(server, "n-bad", "Teal-42")
    assert snap["state"] == State.RECONCILIATION_REQUIRED
    assert snap["receipt"] is None and snap["outbox"] == []
    event = next(e for e in snap["events"] if e["kind"] == "reconciliation_required")
    assert event["data"]["reason"] == "output_rejected"
    assert "does not match" in event["data"]["reasons"][0]
    assert event["data"]["rejected_result_digest"].startswith("sha256:")
    # The rejected body is not stored as the operation's result (nothing could accept it later).
    assert snap["result"] is None and snap["result_digest"] == ""


def test_fail_policy_accepts_a_rejected_result_as_failed(server: ToolServer) -> None:
    with override_settings(TOOLOPS_OUTPUT_DEFENSE_POLICY="fail"):
        snap = _run(server, "n-bad-fail", "Teal-42")
    assert snap["state"] == State.ACCEPTED
    receipt = TerminalReceipt.objects.get(operation_id=snap["id"])
    assert receipt.terminal_status == "failed"
    assert "does not match" in receipt.payload["payload"]["rejected_by_output_defense"][0]
    # The rejected content is not the outcome: only the reasons and the rejected body's digest.
    assert set(receipt.payload["payload"]) == {"isError", "rejected_by_output_defense", "original_kind",
                                               "original_result_digest"}
    assert OutboxEvent.objects.get(receipt=receipt).payload["terminal_status"] == "failed"
    assert [e["kind"] for e in snap["events"]].count("output_rejected") == 1


def test_synchronous_results_pass_the_same_pipeline(server: ToolServer) -> None:
    with override_settings(TOOLOPS_OUTPUT_ALLOWED_CONTENT_TYPES=["image"]):
        op = operation_submit(server_name=server.name, tool_name="quick_sync", call_node_id="n-sync",
                              arguments={"value": "v"})
    snap = operation_snapshot(operation_id=op.id)
    assert snap["state"] == State.RECONCILIATION_REQUIRED and snap["receipt"] is None
    event = next(e for e in snap["events"] if e["kind"] == "reconciliation_required")
    assert "content[0] has type 'text'" in event["data"]["reasons"][0]
