"""Input limits before work, request ids, errors logged: no request produces a 500 from input alone.

Deep nesting, lone surrogates (keys and values), NUL, NaN and oversized bodies are sent to every
write endpoint; each is a 4xx naming the problem (and the field, where there is one), logged
through structlog with the request's id, and nothing is written.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.test import Client, override_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from ledger.models import InputRequest, Membership, Operation, ReconciliationItem
from ledger.states import State
from tests.ledger.factories import OperationFactory, ToolServerFactory
from tests.toolops.api_fixtures import principal
from toolops.rest.parsers import BoundedJSONParser, RequestTooLarge, json_depth
from toolops.services.json_input import MAX_JSON_DEPTH

pytestmark = pytest.mark.django_db

# Raw JSON texts, as an attacker sends them (escapes are decoded by the parser, not by us).
DEEP = "[" * 1000 + "]" * 1000
SURROGATE_KEY = '{"\\ud800": 1}'
SURROGATE_VALUE = '"\\udfff"'
NUL_VALUE = '"a\\u0000b"'



@pytest.fixture
def seeded() -> dict[str, Any]:
    client = principal(username="op", org="acme", role=Membership.Role.OPERATOR)
    server = ToolServerFactory(name="ref", tenant="acme")
    op = OperationFactory(server=server, tenant="acme", state=State.WORKING)
    ir = InputRequest.objects.create(operation=op, round=1, server_request_id="r1",
                                     method="elicitation/create", params={},
                                     schema_digest="sha256:x", deadline=op.created_at)
    item = ReconciliationItem.objects.create(operation=op, reason="t", deadline=op.created_at)
    return {"client": client, "op": op, "urls": [
        ("/api/operations/",
         '{{"server": "ref", "tool": "render", "call_node_id": "n", "arguments": {{"a": {v}}}}}'),
        (f"/api/operations/{op.id}/cancel/", '{{"reason": {v}}}'),
        (f"/api/input-requests/{ir.pk}/answer/",
         '{{"schema_digest": "sha256:x", "response": {{"content": {v}}}}}'),
        (f"/api/reconciliation/{item.pk}/resolve/",
         '{{"resolution": "accept_terminal", "terminal_status": "failed", "reason": "r", '
         '"evidence": {{"e": {v}}}}}'),
    ]}


def _post(client: APIClient, url: str, raw: str) -> Any:
    return client.generic("POST", url, raw.encode("utf-8"), content_type="application/json")


def _nothing_written(seeded: dict[str, Any]) -> None:
    op = Operation.objects.get(id=seeded["op"].id)
    assert op.state == State.WORKING and Operation.objects.count() == 1
    assert InputRequest.objects.get(operation=op).status == "open"
    assert ReconciliationItem.objects.get(operation=op).status == "open"


@pytest.mark.parametrize(("value", "says"), [
    (DEEP, "nested deeper"), (SURROGATE_KEY, "lone surrogate"), (SURROGATE_VALUE, "lone surrogate"),
    (NUL_VALUE, "U+0000"), ("NaN", "NaN"), ("1" + "0" * 5000, "JSON parse error"),
])
def test_hostile_json_is_a_400_naming_the_problem_at_every_write_endpoint(
        seeded: dict[str, Any], value: str, says: str, log_stream: io.StringIO) -> None:
    for url, template in seeded["urls"]:
        response = _post(seeded["client"], url, template.format(v=value))
        assert response.status_code == 400, (url, response.content[:300])
        assert says in response.json()["detail"], (url, response.json())
        if "surrogate" in says or "U+0000" in says:
            assert "body." in response.json()["detail"]  # the field's path
        rid = response["X-Request-ID"]
        logged = [json.loads(line) for line in log_stream.getvalue().splitlines()]
        assert any(x.get("request_id") == rid and x.get("status") == 400 for x in logged)
    _nothing_written(seeded)


def test_a_body_over_the_limit_is_refused_before_it_is_read(seeded: dict[str, Any]) -> None:
    class Unreadable(io.BytesIO):
        def read(self, *a: Any) -> bytes:
            raise AssertionError("the body was read")

    client: APIClient = seeded["client"]
    response = client.generic("POST", "/api/operations/", b"", content_type="application/json",
                              CONTENT_LENGTH=str(100 * 1024 * 1024), **{"wsgi.input": Unreadable()})
    assert response.status_code == 413 and response.json()["error"] == "RequestTooLarge"
    assert response["X-Request-ID"]
    _nothing_written(seeded)


@override_settings(TOOLOPS_MAX_REQUEST_BYTES=1000)
def test_the_parser_caps_what_it_reads_whatever_was_declared() -> None:
    with pytest.raises(RequestTooLarge):
        BoundedJSONParser().parse(io.BytesIO(b'"' + b"x" * 5000 + b'"'))
    assert BoundedJSONParser().parse(io.BytesIO(b'{"a": [1, "]]]"]}')) == {"a": [1, "]]]"]}


def test_request_ids_are_returned_and_a_sane_given_one_kept(seeded: dict[str, Any]) -> None:
    client: APIClient = seeded["client"]
    mine = client.get("/api/operations/", HTTP_X_REQUEST_ID="proxy-abc.123")
    assert mine["X-Request-ID"] == "proxy-abc.123"
    forged = client.get("/api/operations/", HTTP_X_REQUEST_ID="a b\nc")
    assert forged["X-Request-ID"] != "a b\nc" and len(forged["X-Request-ID"]) == 32
    assert Client().get("/admin/login/")["X-Request-ID"]


def test_answers_with_a_surrogate_are_refused_in_admin(seeded: dict[str, Any]) -> None:
    from django.contrib.auth.models import User

    op = seeded["op"]
    Operation.objects.filter(id=op.id).update(state=State.INPUT_REQUIRED)
    ir = InputRequest.objects.get(operation=op)
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
    page = admin.post(f"/admin/ledger/inputrequest/{ir.pk}/answer/", {
        "input_round": 1, "schema_digest": "sha256:x", "action": "accept",
        "content": '{"color": "\\ud800"}'})
    assert page.status_code == 200 and b"lone surrogate" in page.content
    assert InputRequest.objects.get(pk=ir.pk).status == "open"


def test_python_api_and_cli_refuse_the_same_input() -> None:
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from toolops import api
    from toolops.services.json_input import JsonInputRefused

    ToolServerFactory(name="ref")
    for bad in ({"\ud800": 1}, {"q": "a\x00b"}, {"q": float("nan")}):
        with pytest.raises(JsonInputRefused):
            api.submit_call(server="ref", tool="render", call_node_id="n", arguments=bad)
    with pytest.raises(CommandError) as refused:
        call_command("toolops", "submit", "--server", "ref", "--tool", "render", "--call-node", "n",
                     "--args", '{"\\ud800": 1}')
    assert "\n" not in str(refused.value) and "lone surrogate" in str(refused.value)
    assert not Operation.objects.exists()


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), st.text(max_size=8))
hostile_text = st.one_of(
    st.builds(lambda s, c: s + c + s, st.text(max_size=4),
              st.sampled_from(["\x00", "\ud800", "\udfff", "\udbff"])),
)


@st.composite
def hostile_json(draw: Any) -> str:
    """A JSON text with one hostile thing somewhere: deep nesting, or a NUL / lone surrogate in a
    key or a value, at a random depth inside otherwise ordinary JSON."""
    kind = draw(st.sampled_from(["deep", "key", "value"]))
    if kind == "deep":
        depth = draw(st.integers(MAX_JSON_DEPTH + 1, 5000))
        opener = draw(st.sampled_from(["[", '{"k":']))
        closer = "]" if opener == "[" else "}"
        return opener * depth + "1" + closer * depth
    bad = draw(hostile_text)
    node: Any = {bad: 1} if kind == "key" else bad
    for _ in range(draw(st.integers(0, 10))):
        node = draw(st.sampled_from([lambda n: [n], lambda n: {"x": n}]))(node)
    siblings = draw(st.dictionaries(st.text(max_size=4), json_leaf, max_size=3))
    return json.dumps({**siblings, "hostile": node}, ensure_ascii=True)


@given(raw=hostile_json())
@hsettings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_hypothesis_hostile_bodies_never_5xx(seeded: dict[str, Any], raw: str) -> None:
    for url, template in seeded["urls"]:
        response = _post(seeded["client"], url, template.format(v=raw))
        assert 400 <= response.status_code < 500, (url, raw[:200], response.content[:300])
    assert json_depth(raw) > MAX_JSON_DEPTH or "hostile" in raw


@override_settings(ROOT_URLCONF="tests.toolops.urls_failing", DEBUG=False)
def test_an_unhandled_error_is_logged_with_request_id_and_redacted_traceback(
        log_stream: io.StringIO) -> None:
    response = Client(raise_request_exception=False).get("/boom/", HTTP_X_REQUEST_ID="rid-500")
    assert response.status_code == 500 and response["X-Request-ID"] == "rid-500"
    text = log_stream.getvalue()
    logged = [json.loads(line) for line in text.splitlines()]
    failure = [x for x in logged if x.get("event") == "unhandled exception"]
    assert failure and failure[0]["request_id"] == "rid-500"
    assert "RuntimeError" in failure[0]["exception"] and "Traceback" in failure[0]["exception"]
    assert any(x.get("status") == 500 and x.get("request_id") == "rid-500" for x in logged)
    assert "hunter2-pw" not in text and "tok-secret-9" not in text


def test_the_depth_scan_is_linear_on_hostile_quoting() -> None:
    """An unterminated string full of escaped quotes made a searching regex rescan from every
    quote (quadratic: hours for a 2 MiB body). Correct answers, and no hang, on such input."""
    assert json_depth('"' + '\\"' * 500_000) == 0
    assert json_depth('"\\' * 500_000) == 0
    assert json_depth("[" * 1_000_000) == MAX_JSON_DEPTH + 1  # stops at the first level past
    assert json_depth('{"a": [1, "]]]", {"b": "\\\\"}]}') == 3
    assert json_depth('[[["x\\"]"]]]') == 3


def test_a_call_node_id_with_a_surrogate_is_one_cli_line() -> None:
    from django.core.management import call_command
    from django.core.management.base import CommandError

    ToolServerFactory(name="ref")
    for node in ("n\ud800", "n\x00"):
        with pytest.raises(CommandError) as refused:
            call_command("toolops", "submit", "--server", "ref", "--tool", "render", "--call-node", node)
        assert "submission.call_node_id" in str(refused.value)
    assert not Operation.objects.exists()
