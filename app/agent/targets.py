"""Where assistants' webhook tools may connect (no server-side request forgery).

A target must pass two checks:
- its host name is on CHATLOOM_WEBHOOK_ALLOWED_HOSTS (exact names, "*.domain" for subdomains, or
  IP literals; an empty list allows any name);
- every address the name resolves to is public: loopback, private, link-local (169.254.169.254,
  the cloud metadata service), multicast, unspecified, reserved and shared ranges are refused,
  IPv4 inside IPv6 (::ffff:a.b.c.d, 6to4, Teredo, NAT64, ::a.b.c.d) judged by its IPv4 address,
  unless the address is inside CHATLOOM_WEBHOOK_ALLOWED_NETWORKS.
The caller then connects to one of the checked addresses itself (app.agent.webhooks pins it), so a
name that resolves differently a moment later changes nothing."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class TargetRefused(Exception):
    """The webhook target is not one the server may connect to (the message says why)."""


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]  # the client's address
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if int(ip) >> 32 == 0 and int(ip) > 1:  # ::a.b.c.d, the deprecated IPv4-compatible form
        return ipaddress.IPv4Address(int(ip))
    return None


def is_public(ip: IPAddress) -> bool:
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_ipv4(ip)
        if inner is not None:
            return is_public(inner)
    return ip.is_global and not (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_unspecified
        or ip.is_reserved
    )


def parse_ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])  # an IPv6 scope (fe80::1%eth0) dropped
    except ValueError:
        return None


@dataclass(frozen=True)
class TargetPolicy:
    allowed_hosts: tuple[str, ...] = ()  # lower-case names, "*.suffix" or IP literals; empty: any
    allowed_networks: tuple[IPNetwork, ...] = ()  # non-public ranges allowed anyway

    @classmethod
    def from_settings(cls, settings: Any) -> TargetPolicy:
        hosts = getattr(settings, "webhook_allowed_hosts", None) or []
        networks = getattr(settings, "webhook_allowed_networks", None) or []
        return cls(
            tuple(h.strip().lower().strip("[]") for h in hosts if h.strip()),
            tuple(ipaddress.ip_network(n, strict=False) for n in networks),
        )

    def host_allowed(self, host: str) -> bool:
        if not self.allowed_hosts:
            return True
        host = host.lower().rstrip(".")
        for entry in self.allowed_hosts:
            if entry == "*" or host == entry:
                return True
            if entry.startswith("*.") and host.endswith(entry[1:]):
                return True
            literal, given = parse_ip(entry), parse_ip(host)
            if literal is not None and given is not None and literal == given:
                return True
        return False

    def address_allowed(self, ip: IPAddress) -> bool:
        if any(ip in net for net in self.allowed_networks if net.version == ip.version):
            return True
        inner = _embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
        if inner is not None and any(inner in net for net in self.allowed_networks if net.version == 4):
            return True
        return is_public(ip)

    def refusal_for_url(self, url: str) -> str | None:
        """Why a URL is refused before any lookup (scheme, host list, an IP literal), or None."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            return f"only http and https webhooks are called, not {parts.scheme!r}"
        host = parts.hostname or ""
        if not host:
            return "the URL has no host"
        if not self.host_allowed(host):
            return f"the host {host!r} is not in CHATLOOM_WEBHOOK_ALLOWED_HOSTS"
        ip = parse_ip(host)
        if ip is not None and not self.address_allowed(ip):
            return _private(host, ip)
        return None

    async def resolve(self, host: str, port: int) -> list[str]:
        """The addresses of `host`, every one of them checked; raises TargetRefused."""
        if not self.host_allowed(host):
            raise TargetRefused(f"the host {host!r} is not in CHATLOOM_WEBHOOK_ALLOWED_HOSTS")
        try:
            infos = await _getaddrinfo(host, port)
        except (socket.gaierror, UnicodeError) as exc:
            raise TargetRefused(f"the host {host!r} does not resolve: {exc}") from exc
        addresses: list[str] = []
        for info in infos:
            text = str(info[4][0])
            ip = parse_ip(text)
            if ip is None or not self.address_allowed(ip):
                raise TargetRefused(_private(host, ip if ip is not None else text))
            if str(ip) not in addresses:
                addresses.append(str(ip))
        if not addresses:
            raise TargetRefused(f"the host {host!r} has no address")
        return addresses


async def _getaddrinfo(host: str, port: int) -> list[tuple]:
    return await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )


def _private(host: str, ip: object) -> str:
    shown = host if str(ip) == host else f"{host!r} ({ip})"
    return (
        f"{shown} is not a public address (loopback, private, link-local and similar targets are "
        "refused; CHATLOOM_WEBHOOK_ALLOWED_NETWORKS allows a network explicitly)"
    )
