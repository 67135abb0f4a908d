"""Tool server registration and negotiation.

Registration applies the server URL policy (toolops/services/url_policy.py) and keeps credentials
apart from the URL; what a server answered is checked to be storable before anything is written,
so a hostile descriptor is a one-line refusal, never a database error.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from adapters.base import Negotiated, RequestGate, ToolDescriptor
from ledger.digests import canonical_digest
from ledger.models import ToolServer
from toolops.errors import ToolopsError
from toolops.services.adapters_admin import adapter_state_ensure
from toolops.services.connections import (
    door_request_gate,
    server_bucket_hand_over,
    server_request_gate,
)
from toolops.services.json_input import JsonInputRefused, json_input_check
from toolops.services.negotiation import negotiate_auto, negotiate_with
from toolops.services.permissions import SYSTEM, Action, Actor, permission_require
from toolops.services.url_policy import url_check, url_split_credentials


class ServerAnswerRefused(ToolopsError):
    """What the server answered during negotiation cannot be stored; nothing was written."""


def server_public_view(*, server: ToolServer) -> dict[str, Any]:
    """What any entry point may show about a server: never its credentials."""
    return {"name": server.name, "url": server.url, "adapter": server.adapter_version,
            "protocol_version": server.protocol_version, "tools": sorted(server.tools),
            "max_qps": server.max_qps, "has_credentials": bool(server.credentials)}

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
    request_gate: RequestGate | None = None, credentials: dict[str, Any] | None = None,
) -> tuple[Negotiated, list[ToolDescriptor]]:
    return negotiate_with(url=url, adapter_version=adapter_version, options=options,
                          request_gate=request_gate, credentials=credentials)


def server_add(
    *,
    name: str,
    url: str,
    adapter_version: str = DEFAULT_ADAPTER,
    max_qps: float = 10.0,
    sync_bounds: dict[str, float] | None = None,
    options: dict[str, Any] | None = None,
    credential_headers: dict[str, str] | None = None,
    actor: Actor | str = SYSTEM,
) -> ToolServer:
    """Negotiate with a server, then record it. Nothing is written if negotiation fails.

    `adapter_version="auto"` picks the shape (toolops/services/negotiation.py); `options` are
    adapter settings (AIP-151: the tools' configured methods), kept in `capabilities`.
    The URL must pass the server URL policy; userinfo and token-like query parameters are moved
    out of it into `credentials` (with `credential_headers`), sent on every request, never shown.
    """
    permission_require(actor=actor, action=Action.REGISTER, tenant="")
    if max_qps <= 0:
        raise ToolopsError("--max-qps must be positive")
    for label, given in (("sync_bounds", sync_bounds), ("adapter options", options)):
        json_input_check(given, field=label)
    url, credentials = url_split_credentials(url)
    if credential_headers:
        credentials.setdefault("headers", {}).update(
            {str(k): str(v) for k, v in credential_headers.items()})
    url_check(url)
    # The handshake (initialize, initialized, tools/list, and every shape `auto` tries) reaches
    # the server's door like any later request: it passes the same cap, on the URL's bucket.
    gate = door_request_gate(url=url, max_qps=max_qps)
    if adapter_version == "auto":
        adapter_version, negotiated, tools, _notes = negotiate_auto(
            url=url, sync_bounds=dict(sync_bounds or {}), request_gate=gate, credentials=credentials,
        )
    else:
        negotiated, tools = _negotiate(url=url, adapter_version=adapter_version, options=options,
                                       request_gate=gate, credentials=credentials)
    # Checked before the descriptors are digested: canonical JSON cannot encode a lone surrogate.
    for label, value in (("tool descriptors", [t.raw for t in tools]),
                         ("capabilities", negotiated.capabilities),
                         ("server info", negotiated.server_info)):
        try:
            json_input_check(value, field=label)
        except JsonInputRefused as exc:
            raise ServerAnswerRefused(f"the server's {exc}; not registered") from exc
    table = _tools_table(tools)
    try:
        with transaction.atomic():
            server = ToolServer.objects.create(
                name=name,
                url=url,
                credentials=credentials,
                adapter_version=adapter_version,
                protocol_version=negotiated.protocol_version,
                capabilities=negotiated.capabilities,
                server_info=negotiated.server_info,
                session_id=negotiated.session_id or "",
                tools=table,
                sync_bounds=dict(sync_bounds or {}),
                max_qps=max_qps,
                negotiated_at=timezone.now(),
            )
    except IntegrityError as exc:
        raise ToolopsError(f"a server named {name!r} already exists") from exc
    except DatabaseError as exc:
        # Never the driver's message: it may quote the values of the row.
        raise ServerAnswerRefused(
            f"the server's negotiation answer could not be stored ({type(exc).__name__})") from exc
    adapter_state_ensure(version=server.adapter_version)
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
                                   request_gate=server_request_gate(server=server),
                                   credentials=server.credentials)
    for label, value in (("tool descriptors", [t.raw for t in tools]),
                         ("capabilities", negotiated.capabilities)):
        try:
            json_input_check(value, field=label)
        except JsonInputRefused as exc:
            raise ServerAnswerRefused(f"the server's {exc}; session not renewed") from exc
    ToolServer.objects.filter(pk=server_id, session_id=stale_session_id).update(
        session_id=negotiated.session_id or "",
        capabilities=negotiated.capabilities,
        protocol_version=negotiated.protocol_version,
        tools=_tools_table(tools),
        negotiated_at=timezone.now(),
    )
    return ToolServer.objects.get(pk=server_id)
