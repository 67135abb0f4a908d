"""factory-boy factories for the ledger app."""

from __future__ import annotations

import secrets
from datetime import timedelta

import factory
from django.utils import timezone

from ledger.digests import request_digest
from ledger.models import InputRequest, Operation, ToolServer
from ledger.states import State


class ToolServerFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ToolServer

    name = factory.Sequence(lambda n: f"server-{n}")
    url = "http://127.0.0.1:9/mcp"
    adapter_version = "mcp-tasks/2025-11-25"
    capabilities = factory.LazyFunction(
        lambda: {"tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}}
    )
    tools = factory.LazyFunction(
        lambda: {"render": {"task_support": "required", "descriptor_digest": "sha256:d1",
                            "descriptor": {"name": "render"}}}
    )


class OperationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Operation

    server = factory.SubFactory(ToolServerFactory)
    call_node_id = factory.Sequence(lambda n: f"node-{n}")
    tool_name = "render"
    descriptor_version = "sha256:d1"
    body = factory.LazyFunction(lambda: {"name": "render", "arguments": {"n": 1}})
    request_digest = factory.LazyAttribute(
        lambda o: request_digest(tool_name=o.tool_name, arguments=o.body["arguments"],
                                 descriptor_version=o.descriptor_version)
    )
    adapter_version = "mcp-tasks/2025-11-25"
    submission_key = factory.LazyFunction(lambda: secrets.token_hex(16))
    remote_id = factory.Sequence(lambda n: f"task-{n}")
    state = State.WORKING
    next_poll_at = factory.LazyFunction(timezone.now)


class InputRequestFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = InputRequest

    operation = factory.SubFactory(OperationFactory, state=State.INPUT_REQUIRED, next_poll_at=None)
    round = factory.Sequence(lambda n: n + 1)
    server_request_id = factory.Sequence(lambda n: f'"req-{n}"')
    method = "elicitation/create"
    params = factory.LazyFunction(lambda: {"message": "colour?", "requestedSchema": {}})
    schema_digest = "sha256:s1"
    deadline = factory.LazyFunction(lambda: timezone.now() + timedelta(hours=1))
