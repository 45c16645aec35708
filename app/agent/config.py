"""What an assistant is, as the API and the YAML seed file take it (validated once, stored as JSON).

{"name", "system_prompt", "model"?, "sampling"?, "memory"?: {"max_turns" | "max_tokens"},
 "tool_choice"?, "tools"?: [{"type": "function", "function": {...},
                             "webhook": {"url", "method", "headers", "timeout_s"}}],
 "webhook_auth"?: {"type": "none"} | {"type": "basic", "user", "password"}
                  | {"type": "header", "name", "value"},   (None: the server's CHATLOOM_WEBHOOK_AUTH)
 "anonymous_tools"?: false}

Secrets are write-only: webhook_auth's password / value are stored as salted hashes (only ever
compared), and the API shows tools' webhook header values masked (see public_tools).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, SecretStr, field_validator, model_validator

MASK = "********"  # what the API shows in place of a secret


def hash_secret(secret: str) -> str:
    """ "sha256$<salt>$<digest>": a credential the webhook only compares (use long random tokens)."""
    salt = secrets.token_hex(8)
    return f"sha256${salt}${hashlib.sha256((salt + secret).encode()).hexdigest()}"


def verify_secret(given: str, stored: str | None) -> bool:
    if not stored or stored.count("$") != 2:
        return False
    _, salt, digest = stored.split("$")
    return hmac.compare_digest(hashlib.sha256((salt + given).encode()).hexdigest(), digest)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Webhook(_Strict):
    url: HttpUrl
    method: Literal["POST", "PUT", "PATCH", "GET", "DELETE"] = "POST"
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(default=30.0, gt=0, le=600)


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI may add fields (strict, ...)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class Tool(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDef
    webhook: Webhook


class Memory(_Strict):
    max_turns: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=64)

    @model_validator(mode="after")
    def _one(self) -> Memory:
        if self.max_turns is not None and self.max_tokens is not None:
            raise ValueError("memory takes max_turns or max_tokens, not both")
        return self


class Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = None
    min_p: float | None = Field(default=None, ge=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = None
    stop: list[str] | None = None
    repetition_penalty: float | None = Field(default=None, gt=0)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)


class WebhookAuth(_Strict):
    """n8n Chat Trigger's authentication options for this assistant's /webhook/{id}/chat."""

    type: Literal["none", "basic", "header"]
    user: str | None = Field(default=None, min_length=1, max_length=255, pattern=r"^[^:]*$")
    password: SecretStr | None = Field(default=None, min_length=1, max_length=1024)
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")  # a header
    value: SecretStr | None = Field(default=None, min_length=1, max_length=1024)

    @model_validator(mode="after")
    def _complete(self) -> WebhookAuth:
        given = {k for k in ("user", "password", "name", "value") if getattr(self, k) is not None}
        needed = {"none": set(), "basic": {"user", "password"}, "header": {"name", "value"}}[self.type]
        if given != needed:
            wanted = " and ".join(sorted(needed)) or "nothing else"
            raise ValueError(f'webhook_auth of type "{self.type}" takes {wanted}')
        return self

    def stored(self) -> dict[str, Any]:
        if self.type == "basic":
            return {
                "type": "basic",
                "user": self.user,
                "password_hash": hash_secret(self.password.get_secret_value()),
            }
        if self.type == "header":
            return {
                "type": "header",
                "name": self.name,
                "value_hash": hash_secret(self.value.get_secret_value()),
            }
        return {"type": "none"}


def public_webhook_auth(stored: dict[str, Any] | None) -> dict[str, Any] | None:
    """The stored webhook_auth as the API shows it: no hash."""
    if not stored:
        return None
    return {k: v for k, v in stored.items() if not k.endswith("_hash")}


def public_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tools as the API shows them: webhook header values masked, a URL's password too."""
    from urllib.parse import urlsplit, urlunsplit

    out = []
    for tool in tools or []:
        hook = dict(tool.get("webhook") or {})
        if hook.get("headers"):
            hook["headers"] = {name: MASK for name in hook["headers"]}
        if hook.get("url"):
            parts = urlsplit(hook["url"])
            if parts.password is not None:
                host = parts.hostname or ""
                netloc = f"{parts.username or ''}:{MASK}@{f'[{host}]' if ':' in host else host}"
                netloc += f":{parts.port}" if parts.port else ""
                hook["url"] = urlunsplit(parts._replace(netloc=netloc))
        out.append({**tool, "webhook": hook} if "webhook" in tool else dict(tool))
    return out


class AssistantIn(_Strict):
    id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    name: str = Field(min_length=1, max_length=255)
    system_prompt: str = ""
    model: str | None = None
    sampling: Sampling = Field(default_factory=Sampling)
    memory: Memory = Field(default_factory=Memory)
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    tools: list[Tool] = Field(default_factory=list)
    webhook_auth: WebhookAuth | None = None
    anonymous_tools: bool = False  # may anonymous webhook callers (no key, no credential) run tools

    @field_validator("tools")
    @classmethod
    def _unique_names(cls, tools: list[Tool]) -> list[Tool]:
        names = [t.function.name for t in tools]
        if len(names) != len(set(names)):
            raise ValueError("tool names must be unique")
        return tools

    @model_validator(mode="after")
    def _choice_names_a_tool(self) -> AssistantIn:
        choice = self.tool_choice
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            if choice.get("type") != "function" or not name:
                raise ValueError('tool_choice object must be {"type": "function", "function": {"name": ...}}')
            if name not in {t.function.name for t in self.tools}:
                raise ValueError(f"tool_choice names {name!r}, which is not one of the tools")
        elif choice == "required" and not self.tools:
            raise ValueError('tool_choice "required" needs at least one tool')
        return self

    def to_row(self) -> dict[str, Any]:
        """The JSON-ready fields of the assistants table."""
        data = self.model_dump(mode="json", exclude_none=True, exclude={"id", "webhook_auth"})
        data.setdefault("model", None)
        data.setdefault("tool_choice", None)
        data["webhook_auth"] = self.webhook_auth.stored() if self.webhook_auth else None
        return data
