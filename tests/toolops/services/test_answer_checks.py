"""An answer checked against what the server asked, before anything is recorded or sent: every
bad answer, and every schema a server may send that is not one, is a clear refusal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ledger.models import InputRequest
from toolops.services.answer_checks import InputAnswerRefused, elicitation_result

REPO = Path(__file__).resolve().parents[3]
NAME_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def _request(*, schema: Any = NAME_SCHEMA, method: str = "elicitation/create") -> InputRequest:
    params = {"message": "who?"} if schema is None else {"message": "who?", "requestedSchema": schema}
    return InputRequest(method=method, params=params)


def test_bare_content_is_an_accept_and_a_full_result_goes_as_given() -> None:
    assert elicitation_result(ir=_request(), response={"name": "ada"}) == {
        "action": "accept", "content": {"name": "ada"}}
    assert elicitation_result(ir=_request(), response={"action": "decline"}) == {"action": "decline"}


def test_a_sampling_answer_goes_verbatim() -> None:
    answer = {"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "m"}
    assert elicitation_result(ir=_request(method="sampling/createMessage"), response=answer) == answer


@pytest.mark.parametrize(("response", "reason"), [
    ("ada", "must be a JSON object"),
    ({"action": "maybe"}, "action must be one of"),
    ({"name": 3}, "does not match the requested schema"),
    ({"action": "accept", "content": {}}, "does not match the requested schema"),
])
def test_a_bad_answer_is_refused_with_its_reason(response: Any, reason: str) -> None:
    with pytest.raises(InputAnswerRefused, match=reason):
        elicitation_result(ir=_request(), response=response)


@pytest.mark.parametrize("schema", [
    {"type": "no-such-type"},
    {"type": "object", "required": "name"},
    {"properties": {"name": {"minLength": -1}}},
    "a string, not a schema",
    ["a", "list"],
    42,
])
def test_a_server_schema_that_is_not_one_refuses_the_answer_clearly(schema: Any) -> None:
    with pytest.raises(InputAnswerRefused, match="requested schema is"):
        elicitation_result(ir=_request(schema=schema), response={"name": "ada"})


def test_a_long_validator_message_is_cut() -> None:
    schema = {"type": "object", "properties": {"name": {"enum": ["x" * 5000]}}}
    with pytest.raises(InputAnswerRefused) as refused:
        elicitation_result(ir=_request(schema=schema), response={"name": "ada"})
    assert len(str(refused.value)) < 500


def test_no_schema_and_a_boolean_schema_are_honoured() -> None:
    assert elicitation_result(ir=_request(schema=None), response={"x": 1})["action"] == "accept"
    assert elicitation_result(ir=_request(schema=True), response={"x": 1})["action"] == "accept"
    with pytest.raises(InputAnswerRefused, match="does not match"):
        elicitation_result(ir=_request(schema=False), response={"x": 1})


def test_a_worker_process_does_not_load_jsonschema_until_an_answer_is_checked() -> None:
    code = ("import os, sys; os.environ['DJANGO_SETTINGS_MODULE'] = 'config.settings'; "
            "sys.argv = ['celery', '-A', 'config', 'worker']; import config.celery as c; "
            "c.app.loader.import_default_modules(); print('jsonschema' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"
