"""The hot path's cached reads give exactly what the ORM gives, field for field."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.models import Operation, ToolServer
from ledger.selectors.rows import (
    operation_load,
    operation_submission_key_taken,
    operations_load,
    server_load,
)
from tests.ledger.factories import OperationFactory, ToolServerFactory


def _same(a: object, b: object, model: type) -> None:
    for field in model._meta.concrete_fields:  # type: ignore[attr-defined]
        x, y = getattr(a, field.attname), getattr(b, field.attname)
        assert (x, type(x)) == (y, type(y)), field.name


@pytest.mark.django_db
def test_an_operation_loads_as_the_orm_loads_it_with_its_server() -> None:
    server = ToolServerFactory(credentials={"headers": {"Authorization": "Bearer x"}}, max_qps=2.5)
    op = OperationFactory(
        server=server, result={"kind": "result", "payload": {"n": [1, 2.5, None]}},
        lease_owner="w1", lease_expires_at=timezone.now() + timedelta(seconds=5), shadow=False,
        server_progress={"done": 3}, terminal_status="",
    )
    loaded = operation_load(operation_id=op.id)
    orm = Operation.objects.select_related("server").get(id=op.id)
    assert loaded is not None
    _same(loaded, orm, Operation)
    _same(loaded.server, orm.server, ToolServer)
    assert loaded._state.adding is False and loaded._state.db == "default"


@pytest.mark.django_db
def test_a_missing_row_or_server_is_none() -> None:
    import uuid

    assert operation_load(operation_id=uuid.uuid4()) is None
    assert server_load(name="nobody") is None


@pytest.mark.django_db
def test_a_server_loads_by_name_as_the_orm_loads_it() -> None:
    server = ToolServerFactory(name="by-name", sync_bounds={"ping": 2.0})
    loaded = server_load(name="by-name")
    assert loaded is not None
    _same(loaded, ToolServer.objects.get(name="by-name"), ToolServer)
    assert loaded.pk == server.pk


@pytest.mark.django_db
def test_a_taken_submission_key_is_seen_as_the_orm_sees_it() -> None:
    op = OperationFactory(submission_key="k-taken")
    for key in (op.submission_key, "k-free", "k-taken ", "K-TAKEN", ""):
        assert operation_submission_key_taken(submission_key=key) == (
            Operation.objects.filter(submission_key=key).exists()), key
    assert operation_submission_key_taken(submission_key="k-taken") is True
    assert operation_submission_key_taken(submission_key="k-free") is False


@pytest.mark.django_db
def test_a_batch_loads_each_row_as_operation_load_does_in_one_statement() -> None:
    servers = [ToolServerFactory(credentials={"headers": {"X-N": str(n)}}) for n in range(2)]
    ops = [OperationFactory(server=servers[n % 2], result={"n": n}, lease_owner=f"w{n}",
                            lease_expires_at=timezone.now() + timedelta(seconds=n))
           for n in range(5)]
    missing = uuid.uuid4()
    with CaptureQueriesContext(connection) as queries:
        loaded = operations_load(operation_ids=[op.id for op in ops] + [missing])
    assert len(queries.captured_queries) == 1
    assert set(loaded) == {op.id for op in ops}  # the id with no row is absent
    for op in ops:
        one = operation_load(operation_id=op.id)
        assert one is not None
        _same(loaded[op.id], one, Operation)
        _same(loaded[op.id].server, one.server, ToolServer)
        assert loaded[op.id]._state.adding is False and loaded[op.id]._state.db == "default"


@pytest.mark.django_db
def test_an_empty_batch_sends_nothing() -> None:
    with CaptureQueriesContext(connection) as queries:
        assert operations_load(operation_ids=[]) == {}
    assert queries.captured_queries == []
