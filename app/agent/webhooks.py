"""Tools run as HTTP webhooks (typically an n8n workflow that starts with a Webhook node).

A tool is an OpenAI function tool plus
    "webhook": {"url": str, "method": "POST", "headers": {...}, "timeout_s": 30}
The arguments go out as the JSON body (query parameters for GET); the JSON (or text) that comes
back is the tool result. Failures never raise: they come back as an error result for the model.

Every call goes through app.agent.targets: the host must be allowed and every address it resolves
to public (or explicitly allowed); the request then goes to one of those checked addresses (the
URL's host stays in the Host header and in TLS's SNI and certificate check). Redirects are not
followed: a 3xx is an error result, so no credential is ever sent on to another place."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

import httpx

from app.agent.targets import TargetPolicy, TargetRefused

log = logging.getLogger("chatloom.agent.webhooks")

DEFAULT_TIMEOUT_S = 30.0
CONNECT_RETRIES = 2  # extra attempts after a connection error (nothing was sent, so it's safe)
RETRY_BACKOFF_S = 0.2
MAX_RESULT_CHARS = 16_000  # longer results are cut: they go into the prompt


@dataclass
class ToolResult:
    content: str  # what the model sees
    ok: bool
    # why the target may never be called (TargetPolicy, an invalid url): trying again cannot help
    refused: str | None = None


def _error(message: str) -> ToolResult:
    return ToolResult(json.dumps({"error": message}), ok=False)


def _refused(reason: str) -> ToolResult:
    return ToolResult(json.dumps({"error": f"the webhook target is refused: {reason}"}), False, reason)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_RESULT_CHARS else text[:MAX_RESULT_CHARS] + "…[truncated]"


def _pinned(url: httpx.URL, address: str) -> tuple[httpx.URL, dict[str, str], dict[str, Any]]:
    """The URL aimed at one checked address, with the Host header and the TLS name of the original."""
    host = url.host
    netloc = f"[{host}]" if ":" in host else host
    if url.port is not None:
        netloc += f":{url.port}"
    extensions = {"sni_hostname": host} if url.scheme == "https" else {}
    return url.copy_with(host=address), {"Host": netloc}, extensions


async def call_webhook(
    client: httpx.AsyncClient,
    webhook: dict[str, Any],
    arguments: Any,
    policy: TargetPolicy | None = None,
) -> ToolResult:
    """policy: where the call may go (None: the strictest, public addresses only)."""
    policy = policy or TargetPolicy()
    url = webhook.get("url")
    if not url:
        return _error("the tool has no webhook url")
    method = str(webhook.get("method") or "POST").upper()
    timeout = float(webhook.get("timeout_s") or DEFAULT_TIMEOUT_S)
    # the Host header is ours to set: it names the URL's host while the socket goes to a checked address
    headers = {k: v for k, v in dict(webhook.get("headers") or {}).items() if k.lower() != "host"}
    try:
        target = httpx.URL(url)
    except httpx.InvalidURL as exc:
        return _refused(f"the webhook url is not valid: {exc}")
    reason = policy.refusal_for_url(str(target))
    if reason:
        log.warning("webhook %s refused: %s", target.host, reason)
        return _refused(reason)
    try:
        port = target.port or (443 if target.scheme == "https" else 80)
        addresses = await asyncio.wait_for(policy.resolve(target.host, port), timeout)
    except TargetRefused as exc:
        log.warning("webhook %s refused: %s", target.host, exc)
        return _refused(str(exc))
    except TimeoutError:
        return _error(f"the webhook's host did not resolve within {timeout:g} s")
    request: dict[str, Any] = {"timeout": timeout, "follow_redirects": False}
    if method in ("GET", "DELETE"):
        if isinstance(arguments, dict):
            request["params"] = {k: v if isinstance(v, str) else json.dumps(v) for k, v in arguments.items()}
    else:
        request["json"] = arguments
    for attempt in range(CONNECT_RETRIES + 1):
        pinned, host_header, extensions = _pinned(target, addresses[attempt % len(addresses)])
        try:
            response = await client.request(
                method, pinned, headers={**headers, **host_header}, extensions=extensions, **request
            )
            break
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            if attempt == CONNECT_RETRIES:
                return _error(f"could not connect to the webhook after {attempt + 1} attempts: {exc}")
            await asyncio.sleep(RETRY_BACKOFF_S * (attempt + 1))
        except httpx.TimeoutException:
            return _error(f"the webhook did not answer within {timeout:g} s")
        except httpx.HTTPError as exc:
            return _error(f"webhook request failed: {type(exc).__name__}: {exc}")
    body = response.text
    if response.is_redirect:
        log.warning(
            "webhook %s answered a redirect (HTTP %d), not followed", target.host, response.status_code
        )
        return _error(
            f"the webhook answered a redirect (HTTP {response.status_code}); redirects are not followed"
        )
    if response.status_code >= 400:
        log.warning("webhook %s answered HTTP %d", target.host, response.status_code)
        return ToolResult(
            json.dumps({"error": f"the webhook answered HTTP {response.status_code}", "body": _cut(body)}),
            ok=False,
        )
    try:
        # compact, stable JSON (n8n answers `[{"response": ...}]` or an object)
        data = response.json()
        return ToolResult(_cut(json.dumps(data, ensure_ascii=False, separators=(",", ":"))), ok=True)
    except ValueError:
        return ToolResult(_cut(body), ok=True)
