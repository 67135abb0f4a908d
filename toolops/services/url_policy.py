"""The one place that decides which tool server URLs may be registered and contacted.

Rules, in order (each refusal is `UrlRefused` with a one-line reason):
* scheme http or https only; a host is required;
* the host is a canonical name or a canonical IP literal: numeric forms that resolvers read as
  addresses but that are not dotted quads (`2130706433`, `127.1`, `0x7f.1`, `0177.0.0.1`) are
  refused, since they exist to slip past string checks;
* every address the host resolves to is checked: never link-local (169.254/16, fe80::/10, which
  holds the 169.254.169.254 metadata service), the metadata addresses themselves (also
  fd00:ec2::254), unspecified (0.0.0.0, ::), "this network" (0/8), multicast or broadcast;
* and every address must be allowed by `TOOLOPS_SERVER_HOSTS`, a comma-separated allow-list:
  `public` (any globally routable address; the default), an address or CIDR (`10.0.0.0/8`,
  `127.0.0.0/8`, `::1`), or a host name (`tools.internal`, `*.corp.example`: the name and, for the
  `*.` form, its subdomains), whose addresses are then allowed even when private. Loopback and
  private networks are never allowed unless listed.

The same check runs at registration (after DNS resolution) and again at connect time on the
address actually connected to (toolops/services/server_transport.py), so a name that resolves to
something else later (DNS rebinding) is refused when it matters. Redirects are never followed
(every adapter's client has follow_redirects=False).

Credentials never stay in the stored URL: userinfo and token-like query parameters are split off
at registration (`url_split_credentials`) and kept in ToolServer.credentials, which only the
connection layer reads.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from django.conf import settings

from toolops.errors import ToolopsError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SCHEMES = frozenset({"http", "https"})
# Never contacted, whatever the allow-list says.
METADATA = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"),
                      ipaddress.ip_address("100.100.100.200")})
THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
# Query parameter names (lower-cased, separators removed) that carry credentials.
CREDENTIAL_QUERY_KEYS = frozenset({
    "token", "accesstoken", "authtoken", "idtoken", "refreshtoken", "apikey", "key", "secret",
    "clientsecret", "password", "passwd", "pwd", "auth", "authorization", "sig", "signature",
    "session", "sessionid", "jwt", "code", "privatekey", "accesskey", "credential", "credentials",
})
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$", re.IGNORECASE)


class UrlRefused(ToolopsError):
    """The URL (or an address it resolves to) is outside the server URL policy."""


@dataclass(frozen=True)
class Allowed:
    public: bool
    networks: tuple[IPNetwork, ...]
    names: tuple[str, ...]  # exact names
    suffixes: tuple[str, ...]  # ".corp.example" for "*.corp.example"


def allowed_hosts(raw: str | Iterable[str] | None = None) -> Allowed:
    """Parse TOOLOPS_SERVER_HOSTS (a comma-separated string or a list)."""
    if raw is None:
        raw = settings.TOOLOPS_SERVER_HOSTS
    entries = raw.split(",") if isinstance(raw, str) else list(raw)
    public, networks, names, suffixes = False, [], [], []
    for entry in (e.strip().lower() for e in entries):
        if not entry:
            continue
        if entry == "public":
            public = True
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
            continue
        except ValueError:
            pass
        if entry.startswith("*."):
            suffixes.append(entry[1:])
        else:
            names.append(entry.rstrip("."))
    return Allowed(public=public, networks=tuple(networks), names=tuple(names),
                   suffixes=tuple(suffixes))


def _unmapped(addr: IPAddress) -> IPAddress:
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return addr.ipv4_mapped
        if addr.sixtofour is not None:
            return addr.sixtofour
    return addr


def address_refusal(addr: IPAddress, *, host: str, allowed: Allowed) -> str | None:
    """Why `addr` (an address `host` resolved to) may not be contacted, or None."""
    addr = _unmapped(addr)
    if addr in METADATA:
        return f"{addr} is a cloud metadata address"
    if addr.is_unspecified or (isinstance(addr, ipaddress.IPv4Address) and addr in THIS_NETWORK):
        return f"{addr} is unspecified"
    if addr.is_link_local:
        return f"{addr} is link-local"
    if addr.is_multicast or (isinstance(addr, ipaddress.IPv4Address)
                             and addr == ipaddress.IPv4Address("255.255.255.255")):
        return f"{addr} is multicast or broadcast"
    name = host.lower().rstrip(".")
    if name in allowed.names or any(name.endswith(s) for s in allowed.suffixes):
        return None
    if any(addr in net for net in allowed.networks):
        return None
    if allowed.public and addr.is_global:
        return None
    kind = "loopback" if addr.is_loopback else "private" if addr.is_private else "not public"
    return f"{addr} ({kind}) is not in TOOLOPS_SERVER_HOSTS"


def host_literal(host: str) -> IPAddress | None:
    """The IP a host names literally, or None for a name. Non-canonical numeric forms raise."""
    bare = host.strip("[]")
    try:
        addr = ipaddress.ip_address(bare.split("%", 1)[0])
    except ValueError:
        addr = None
    if addr is not None:
        if "%" in bare:
            raise UrlRefused(f"host {host!r} carries a zone id")
        return addr
    # WHATWG URL and inet_aton read a host whose last label is numeric as an IPv4 address
    # (2130706433, 127.1, 0x7f.1, 0177.0.0.1); only the canonical dotted quad is accepted.
    labels = bare.rstrip(".").split(".")
    if labels and _NUMERIC_LABEL.match(labels[-1]):
        raise UrlRefused(f"host {host!r} is a non-canonical numeric address")
    return None


def host_check(host: str) -> IPAddress | None:
    """Syntax-level host check (no DNS): returns the literal address, if the host is one."""
    if not host:
        raise UrlRefused("the URL has no host")
    if any(ord(c) < 0x21 or c in "\\/@" for c in host):
        raise UrlRefused(f"host {host!r} has characters a host may not have")
    return host_literal(host)


def host_addresses(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to (a literal is its own); UrlRefused when none."""
    literal = host_check(host)
    if literal is not None:
        return [literal]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UrlRefused(f"host {host!r} does not resolve: {exc}") from exc
    found: list[IPAddress] = []
    for info in infos:
        addr = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if addr not in found:
            found.append(addr)
    if not found:
        raise UrlRefused(f"host {host!r} does not resolve")
    return found


def addresses_check(host: str, addresses: Iterable[IPAddress], *, allowed: Allowed | None = None) -> None:
    allowed = allowed or allowed_hosts()
    for addr in addresses:
        why = address_refusal(addr, host=host, allowed=allowed)
        if why is not None:
            raise UrlRefused(f"host {host!r} refused: {why}")


def _parts(url: str) -> tuple[Any, str, int]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UrlRefused(f"not a valid URL: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise UrlRefused(f"scheme {parts.scheme or '(none)'!r} is not allowed; http or https only")
    host = parts.hostname or ""
    return parts, host, port or (443 if scheme == "https" else 80)


def url_check(url: str, *, resolve: bool = True) -> None:
    """Refuse a URL outside the policy. `resolve`: also check what the host resolves to now."""
    _parts_, host, port = _parts(url)
    literal = host_check(host)
    if literal is not None:
        addresses_check(host, [literal])
    elif resolve:
        addresses_check(host, host_addresses(host, port))


def _credential_key(name: str) -> bool:
    return re.sub(r"[^a-z0-9]", "", name.lower()) in CREDENTIAL_QUERY_KEYS


def url_split_credentials(url: str) -> tuple[str, dict[str, dict[str, str]]]:
    """(the URL without userinfo or token-like query parameters, the credentials taken out).

    Userinfo becomes an HTTP Basic `Authorization` header; query credentials are kept by name and
    added back to each request at send time, so the server sees what it was given.
    """
    parts, host, _port = _parts(url)
    credentials: dict[str, dict[str, str]] = {}
    if parts.username is not None or parts.password is not None:
        import base64

        pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        credentials["headers"] = {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}
    kept, secret = [], {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if _credential_key(key):
            secret[key] = value
        else:
            kept.append((key, value))
    if secret:
        credentials["query"] = secret
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    clean = urlunsplit((parts.scheme.lower(), netloc, parts.path,
                        urlencode(kept, quote_via=quote), ""))
    return clean, credentials


def url_without_credentials(url: str) -> str:
    """`url` with userinfo and credential-like query parameters removed (for display)."""
    try:
        return url_split_credentials(url)[0]
    except UrlRefused:
        return "[unparseable url]"


def url_display(url: str) -> str:
    """A URL safe to show or log: userinfo and credential-like query values masked."""
    try:
        clean, credentials = url_split_credentials(url)
    except UrlRefused:
        return "[unparseable url]"
    if not credentials:
        return clean
    return clean + " [credentials redacted]"
