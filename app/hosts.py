"""The Host header check (DNS rebinding): a page on a foreign name that resolves to this server
reaches it with its own name in Host, so requests naming no allowed host get a 400 in the OpenAI
error shape before anything else runs.

/health is exempt: orchestrators probe it by the pod's address, and it tells nothing.

Entries: exact names or IP literals (IPv6 with or without brackets), "*.domain" for its
subdomains, "*" for any host; compared case-insensitively, without the port."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import error_body


def host_name(value: str) -> str:
    """ "Example.COM:8000" -> "example.com"; "[::1]:8000" -> "::1"."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value.rstrip(".")


def _matches(host: str, entries: list[str]) -> bool:
    for entry in entries:
        if entry == "*" or host == entry:
            return True
        if entry.startswith("*.") and host.endswith(entry[1:]):
            return True
    return False


class HostCheckMiddleware:
    def __init__(self, app: ASGIApp, allowed_hosts: list[str]) -> None:
        self.app = app
        self.allowed = [host_name(h) if h != "*" else "*" for h in allowed_hosts if h.strip()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] not in ("http", "websocket")
            or "*" in self.allowed
            or scope.get("path") == "/health"
        ):
            await self.app(scope, receive, send)
            return
        raw = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"host"), "")
        host = host_name(raw)
        if host and _matches(host, self.allowed):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        shown = repr(raw) if raw else "none"
        message = (
            f"Host {shown} is not allowed: this server answers to {', '.join(self.allowed)} "
            "(CHATLOOM_ALLOWED_HOSTS)."
        )
        body = json.dumps(error_body(message, "invalid_request_error", None, "invalid_host")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
