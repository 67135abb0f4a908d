"""The `toolops` command line, run as a real subprocess on the embedded default (SQLite)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def test_submit_run_show_contract(cli, mcp_url: str) -> None:  # type: ignore[no-untyped-def]
    added = json.loads(cli("toolops", "server-add", "ref", "--url", mcp_url, "--max-qps", "5").stdout)
    assert added["protocol_version"] == "2025-11-25" and "sleep_then_complete" in added["tools"]
    sub = json.loads(cli("toolops", "submit", "--server", "ref", "--tool", "sleep_then_complete",
                         "--call-node", "cli-node", "--args", '{"seconds": 0.2, "value": "v"}',
                         "--ttl-ms", "60000").stdout)
    assert {"operation_id", "state", "submission_key"} <= set(sub) and sub["state"] == "WORKING"
    ran = json.loads(cli("toolops", "run", "--until-idle", "--max-seconds", "30").stdout)
    assert ran["polls"] >= 1
    shown = json.loads(cli("toolops", "show", sub["operation_id"]).stdout)
    ledger_fields = {"call_node_id", "request_digest", "tool_name", "descriptor_version", "body",
                     "remote_id", "adapter_version", "submission_key", "next_poll_at",
                     "poll_attempts", "observation_seq", "lease_owner", "lease_expires_at",
                     "server_state", "state", "input_round", "cancel_generation",
                     "execution_epoch", "expires_at", "result_digest"}
    assert ledger_fields <= set(shown), ledger_fields - set(shown)
    assert shown["state"] == "ACCEPTED" and shown["receipt"]["terminal_status"] == "completed"
    assert len(shown["outbox"]) == 1
    assert [e["seq"] for e in shown["events"]] == sorted(e["seq"] for e in shown["events"])
    # `show` finds the row by remote id and by submission key too
    for ref in (shown["remote_id"], shown["submission_key"]):
        assert json.loads(cli("toolops", "show", ref).stdout)["id"] == sub["operation_id"]


@pytest.mark.parametrize(
    "args,message",
    [
        (("submit", "--server", "nope", "--tool", "t", "--call-node", "n"), "no tool server named"),
        (("submit", "--server", "nope", "--tool", "t", "--call-node", "n", "--args", "{bad"),
         "--args is not valid JSON"),
        (("show", "00000000-0000-0000-0000-000000000000"), "no operation matches"),
        (("server-add", "down", "--url", "http://127.0.0.1:9/mcp"), "negotiation with"),
    ],
)
def test_errors_exit_non_zero_with_one_line_and_write_nothing(cli, args, message) -> None:  # type: ignore[no-untyped-def]
    proc = cli("toolops", *args, check=False)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    count = cli("shell", "-c", "from ledger.models import Operation, ToolServer; "
                "print(Operation.objects.count(), ToolServer.objects.count())"
                ).stdout.strip().splitlines()[-1].split()
    assert count == ["0", "0"]


def test_demo_runs_on_the_embedded_default(cli) -> None:  # type: ignore[no-untyped-def]
    proc = cli("toolops", "demo")
    out = proc.stdout
    assert "4/4 calls accepted" in out
    assert "database: sqlite" in out
    # A newcomer reads it without the source: the legend once, a failed call as a failure with its
    # error text, and the synchronous call counted beside the polls.
    assert out.count("Local states (ours") == 1 and "docs/state-table.md" in out
    failed = out.split("sleep_then_fail [", 1)[1].split("\n\n", 1)[0]
    assert "outcome: FAILED" in failed and "error:   upload is corrupt" in failed
    assert "empty is_error" not in out
    is_error = out.split("sleep_then_is_error [", 1)[1].split("\n\n", 1)[0]
    assert "isError=true" in is_error and "3 rows rejected" in is_error
    assert "accepted_at_submit     1" in out
    assert "plus 1 synchronous call(s) accepted at submit" in out
