"""The OpenAPI schema (drf-spectacular) is served, valid, and fuzzed with schemathesis: no 5xx.

Every operation of the schema is called with generated path parameters, query strings, headers
(Idempotency-Key included) and bodies, authenticated as a real tenant principal, over the real WSGI
application and database. The server registered for the tenant points at a closed port, so a
generated body that happens to be a valid submission is refused by the network, not sent anywhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from rest_framework.test import APIClient
from schemathesis.checks import response_schema_conformance

from ledger.models import InputRequest, ReconciliationItem
from tests.ledger.factories import OperationFactory, ToolServerFactory
from tests.toolops.api_fixtures import principal

# Enough cases per operation to reach every parameter's edge shapes, small enough for 2 shared cores.
FUZZ_EXAMPLES = 40


@pytest.fixture
def seeded_token(db: None) -> str:
    client = principal(username="fuzzer", org="acme")
    server = ToolServerFactory(name="ref", tenant="acme")
    op = OperationFactory(server=server, tenant="acme")
    InputRequest.objects.create(operation=op, round=1, server_request_id="r1", method="m", params={},
                                schema_digest="sha256:x", deadline=op.created_at)
    ReconciliationItem.objects.create(operation=op, reason="test", deadline=op.created_at)
    return str(client._credentials["HTTP_AUTHORIZATION"])


@pytest.fixture
def api_schema(db: None) -> Iterator[schemathesis.schemas.BaseSchema]:
    # The WSGI handler closes the connection after each request; the test's transaction lives on
    # it, so (as Django's own test client does) keep it open while the fuzzer calls the app.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application())
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


schema = schemathesis.pytest.from_fixture("api_schema")


def no_server_error(ctx: object, response: Any, case: schemathesis.Case) -> bool:
    """Any 5xx fails."""
    assert response.status_code < 500, (
        f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:500]}"
    )
    return True


@schema.parametrize()
@settings(max_examples=FUZZ_EXAMPLES, deadline=None,
          suppress_health_check=list(HealthCheck))
def test_no_server_error_and_responses_match_the_schema(case: schemathesis.Case, seeded_token: str) -> None:
    case.call_and_validate(headers={"Authorization": seeded_token},
                           checks=[no_server_error, response_schema_conformance])


def test_schema_lists_every_endpoint_and_the_idempotency_header(db: None) -> None:
    doc = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    paths = doc["paths"]
    for path in ["/api/operations/", "/api/operations/{id}/", "/api/operations/{id}/cancel/",
                 "/api/input-requests/", "/api/input-requests/{id}/answer/", "/api/reconciliation/",
                 "/api/reconciliation/{id}/resolve/", "/api/servers/", "/api/servers/{name}/"]:
        assert path in paths, path
    create = paths["/api/operations/"]["post"]
    assert any(p["name"] == "Idempotency-Key" and p["in"] == "header" for p in create["parameters"])
    assert {"201", "200", "409", "422"} <= set(create["responses"])
    docs_page = APIClient().get("/api/docs/")
    assert docs_page.status_code == 200 and b"swagger-ui" in docs_page.content
