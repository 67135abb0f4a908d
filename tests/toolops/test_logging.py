"""Structured JSON logs: operation identity on every line, secrets and results redacted."""

from __future__ import annotations

import io
import json
import logging
import logging.config

import pytest
from django.test import override_settings

from ledger.models import ToolServer
from toolops.logging import get_logger, operation_log_context
from toolops.runner import run_embedded
from toolops.services.servers import server_add
from toolops.services.submit import operation_submit

FIELDS = ("operation_id", "call_node_id", "server", "adapter_version")



def test_every_line_names_the_operation_fields(log_stream: io.StringIO) -> None:
    log = get_logger("toolops.test")
    with operation_log_context(operation_id="op-1", call_node_id="node-1", server="ref",
                               adapter_version="mcp-tasks/2025-11-25"):
        log.info("inside", attempt=2)
        logging.getLogger("ledger.test").warning("stdlib %s", "inside")
    log.info("outside")
    parsed = [json.loads(x) for x in log_stream.getvalue().splitlines()]
    assert [p["event"] for p in parsed] == ["inside", "stdlib inside", "outside"]
    for p in parsed[:2]:
        assert {f: p[f] for f in FIELDS} == {"operation_id": "op-1", "call_node_id": "node-1",
                                             "server": "ref", "adapter_version": "mcp-tasks/2025-11-25"}
    assert all(parsed[2][f] is None for f in FIELDS)  # present on every line, null outside
    assert parsed[0]["attempt"] == 2 and parsed[0]["level"] == "info" and "timestamp" in parsed[0]


def test_secrets_and_results_never_reach_the_log(log_stream: io.StringIO) -> None:
    get_logger("toolops.test").warning(
        "call", api_token="tok-123", headers={"Authorization": "Bearer sekrit", "x-ok": "1"},
        arguments={"q": "private question"}, payload={"content": [{"text": "full result"}]},
        nested=[{"password": "pw", "result": "r" * 50}], count=3,
    )
    text = log_stream.getvalue()
    for secret in ("tok-123", "sekrit", "private question", "full result", "pw\"", "rrrrr"):
        assert secret not in text
    line = json.loads(text.splitlines()[-1])
    assert line["api_token"] == "[redacted]" and line["headers"]["Authorization"] == "[redacted]"
    assert line["headers"]["x-ok"] == "1" and line["count"] == 3
    assert line["arguments"].startswith("[redacted ") and line["payload"].startswith("[redacted ")


@pytest.mark.django_db
def test_a_real_rejection_logs_its_operation_and_no_result(log_stream: io.StringIO, mcp_url: str) -> None:
    server = server_add(name="ref", url=mcp_url)
    tools = dict(server.tools)
    tools["sleep_then_complete"]["descriptor"]["outputSchema"] = {
        "type": "object", "properties": {"value": {"const": "never"}}, "required": ["value"]}
    ToolServer.objects.filter(pk=server.pk).update(tools=tools)
    with override_settings(TOOLOPS_OUTPUT_DEFENSE_POLICY="reconcile"):
        op = operation_submit(server_name="ref", tool_name="sleep_then_complete", call_node_id="n-log",
                              arguments={"seconds": 0.1, "value": "secret-value-xyz"}, ttl_ms=60_000)
        run_embedded(until_idle=True, max_seconds=30)
    text = log_stream.getvalue()
    parsed = [json.loads(x) for x in text.splitlines()]
    rejected = [p for p in parsed if p["event"] == "result rejected by output defense"]
    assert len(rejected) == 1
    assert rejected[0]["operation_id"] == str(op.id) and rejected[0]["call_node_id"] == "n-log"
    assert rejected[0]["server"] == "ref" and rejected[0]["adapter_version"] == op.adapter_version
    assert "secret-value-xyz" not in text


@pytest.mark.parametrize("key", ["X-Api-Key", "x_api_key", "auth", "AUTH", "pwd", "passwd", "Passwd",
                                 "private_key", "Private-Key", "access_key", "AWS_ACCESS_KEY",
                                 "client_secret", "refresh-token", "Cookie", "set_cookie", "session",
                                 "Session-Id", "sessionid"])
def test_secret_keys_redacted_whatever_their_case_and_separators(log_stream: io.StringIO, key: str) -> None:
    get_logger("toolops.test").warning("k", **{key: "hunter2-value", "nested": {key: "hunter2-value"}})
    assert "hunter2-value" not in log_stream.getvalue()


def test_credentials_in_urls_and_messages_are_redacted(log_stream: io.StringIO) -> None:
    log = get_logger("toolops.test")
    log.warning("contacting http://ops:hunter2-pw@tools.example/mcp?v=1&token=tok-secret-1",
                url="https://u:hunter2-pw@h.example/x?api_key=tok-secret-2&access_token=tok-secret-3",
                header="Bearer tok-secret-4abcdef")
    logging.getLogger("django.request").error("failed for %s", "http://a:hunter2-pw@h/?sig=tok-secret-5")
    text = log_stream.getvalue()
    for secret in ("hunter2-pw", "tok-secret-1", "tok-secret-2", "tok-secret-3", "tok-secret-4",
                   "tok-secret-5"):
        assert secret not in text, secret
    assert "tools.example/mcp?v=1" in text  # the rest of the URL is kept


def test_exception_messages_and_tracebacks_are_redacted(log_stream: io.StringIO) -> None:
    try:
        raise RuntimeError("connect to http://ops:hunter2-pw@h.example/?token=tok-secret-6 failed")
    except RuntimeError:
        get_logger("toolops.test").exception("boom")
        logging.getLogger("ledger.test").exception("boom too")
    text = log_stream.getvalue()
    assert "Traceback" in text and "RuntimeError" in text
    assert "hunter2-pw" not in text and "tok-secret-6" not in text


@pytest.mark.django_db
def test_a_postgresql_error_traceback_carries_no_row_values(log_stream: io.StringIO) -> None:
    """A real DataError: PostgreSQL quotes the offending JSON (the row's values) in CONTEXT."""
    from django.db import DataError, transaction

    from tests.ledger.factories import OperationFactory

    op = OperationFactory()
    try:
        with transaction.atomic():
            from ledger.models import Operation
            Operation.objects.filter(id=op.id).update(
                body={"arguments": {"card": "4111-secret-row-value", "x": "\x00"}})
    except DataError:
        get_logger("toolops.test").exception("write failed")
        logging.getLogger("django.request").exception("write failed")
    else:
        pytest.fail("PostgreSQL accepted U+0000 in jsonb")
    text = log_stream.getvalue()
    assert "DataError" in text or "UntranslatableCharacter" in text
    assert "4111-secret-row-value" not in text


def test_uncaught_tracebacks_on_stderr_are_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    from toolops.logging import redacted_excepthook

    try:
        raise ValueError("password=hunter2-pw at http://u:p@h/?token=tok-secret-7")
    except ValueError as exc:
        redacted_excepthook(type(exc), exc, exc.__traceback__)
    err = capsys.readouterr().err
    assert "ValueError" in err and "hunter2-pw" not in err and "tok-secret-7" not in err
