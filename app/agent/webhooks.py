"""Tools run as HTTP webhooks (typically an n8n workflow that starts with a Webhook node).

A tool is an OpenAI function tool plus
    "webhook": {"url": str, "method": "POST", "headers": {...}, "timeout_s": 30}
The arguments go out as the JSON body (query parameters for GET); the JSON (or text) that comes
back is the tool result. Failures never raise: they come back as an error result for the model."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

import httpx

log = logging.getLogger("chatloom.agent.webhooks")

DEFAULT_TIMEOUT_S = 30.0
CONNECT_RETRIES = 2  # extra attempts after a connection error (nothing was sent, so it's safe)
RETRY_BACKOFF_S = 0.2
MAX_RESULT_CHARS = 16_000  # longer results are cut: they go into the prompt


@dataclass
class ToolResult:
    content: str  # what the model sees
    ok: bool


def _error(message: str) -> ToolResult:
    return ToolResult(json.dumps({"error": message}), ok=False)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_RESULT_CHARS else text[:MAX_RESULT_CHARS] + "…[truncated]"


async def call_webhook(client: httpx.AsyncClient, webhook: dict[str, Any], arguments: Any) -> ToolResult:
    url = webhook.get("url")
    if not url:
        return _error("the tool has no webhook url")
    method = str(webhook.get("method") or "POST").upper()
    timeout = float(webhook.get("timeout_s") or DEFAULT_TIMEOUT_S)
    headers = dict(webhook.get("headers") or {})
    request: dict[str, Any] = {"headers": headers, "timeout": timeout}
    if method in ("GET", "DELETE"):
        if isinstance(arguments, dict):
            request["params"] = {k: v if isinstance(v, str) else json.dumps(v) for k, v in arguments.items()}
    else:
        request["json"] = arguments
    for attempt in range(CONNECT_RETRIES + 1):
        try:
            response = await client.request(method, url, **request)
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
    if response.status_code >= 400:
        log.warning("webhook %s answered HTTP %d", url, response.status_code)
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
