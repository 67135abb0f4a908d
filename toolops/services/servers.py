"""Tool server registration and negotiation."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from adapters.base import Negotiated, RequestGate, ToolDescriptor
from ledger.digests import canonical_digest
from ledger.models import ToolServer
from toolops.errors import ToolopsError
from toolops.services.connections import (
    door_request_gate,
    server_bucket_hand_over,
    server_request_gate,
)
from toolops.services.negotiation import negotiate_auto, negotiate_with

DEFAULT_ADAPTER = "mcp-tasks/2025-11-25"


def _tools_table(tools: list[ToolDescriptor]) -> dict[str, Any]:
    return {
        t.name: {
            "task_support": t.task_support,
            "descriptor_digest": canonical_digest(t.raw),
            "descriptor": t.raw,
        }
        for t in tools
    }


def _negotiate(
    *, url: str, adapter_version: str, options: dict[str, Any] | None = None,
    request_gate: RequestGate | None = None,
) -> tuple[Negotiated, list[ToolDescriptor]]:
    return negotiate_with(url=url, adapter_version=adapter_version, options=options,
                          request_gate=request_gate)


def server_add(
    *,
    name: str,
    url: str,
    adapter_version: str = DEFAULT_ADAPTER,
    max_qps: float = 10.0,
    sync_bounds: dict[str, float] | None = None,
    options: dict[str, Any] | None = None,
) -> ToolServer:
    """Negotiate with a server, then record it. Nothing is written if negotiation fails.

    `adapter_version="auto"` picks the shape (toolops/services/negotiation.py); `options` are
    adapter settings (AIP-151: the tools' configured methods), kept in `capabilities`.
    """
    if max_qps <= 0:
        raise ToolopsError("--max-qps must be positive")
    # The handshake (initialize, initialized, tools/list, and every shape `auto` tries) reaches
    # the server's door like any later request: it passes the same cap, on the URL's bucket.
    gate = door_request_gate(url=url, max_qps=max_qps)
    if adapter_version == "auto":
        adapter_version, negotiated, tools, _notes = negotiate_auto(
            url=url, sync_bounds=dict(sync_bounds or {}), request_gate=gate
        )
    else:
        negotiated, tools = _negotiate(url=url, adapter_version=adapter_version, options=options,
                                       request_gate=gate)
    try:
        with transaction.atomic():
            server = ToolServer.objects.create(
                name=name,
                url=url,
                adapter_version=adapter_version,
                protocol_version=negotiated.protocol_version,
                capabilities=negotiated.capabilities,
                server_info=negotiated.server_info,
                session_id=negotiated.session_id or "",
                tools=_tools_table(tools),
                sync_bounds=dict(sync_bounds or {}),
                max_qps=max_qps,
                negotiated_at=timezone.now(),
            )
    except IntegrityError as exc:
        raise ToolopsError(f"a server named {name!r} already exists") from exc
    server_bucket_hand_over(server=server)
    return server


def server_renegotiate(*, server_id: int, stale_session_id: str) -> ToolServer:
    """Open a new session after the old one was lost, unless another worker already did.

    The conditional UPDATE on the stale session id makes concurrent workers converge on one new
    session: the loser's UPDATE matches nothing and it reloads the winner's session.
    Tasks of the lost session stay unreachable; their rows go to reconciliation, never resubmitted.
    """
    server = ToolServer.objects.get(pk=server_id)
    if server.session_id != stale_session_id:
        return server
    # A server in use: the handshake's requests count against its cap like any other.
    negotiated, tools = _negotiate(url=server.url, adapter_version=server.adapter_version,
                                   options=server.capabilities.get("adapter_options"),
                                   request_gate=server_request_gate(server=server))
    ToolServer.objects.filter(pk=server_id, session_id=stale_session_id).update(
        session_id=negotiated.session_id or "",
        capabilities=negotiated.capabilities,
        protocol_version=negotiated.protocol_version,
        tools=_tools_table(tools),
        negotiated_at=timezone.now(),
    )
    return ToolServer.objects.get(pk=server_id)
