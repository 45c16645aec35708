"""Who is calling: the owner written on the sessions and assistants a caller creates, and the owners
whose rows it may see. A row owned by anyone else is, to this caller, a row that does not exist.

- the API key holder: "key:<16 hex of sha256(key)>"; it also reads DEFAULT (the operator's rows:
  those made while the server was open, before owners existed, seeded assistants, sessions found
  only in n8n's history table)
- any caller of an open server (no API key): DEFAULT
- a webhook caller with the webhook's credential, or an anonymous one while the server has a key:
  "webhook:<assistant id>"; the anonymous one is marked `anonymous` (see app.api.webhook_auth)"""

from __future__ import annotations

import hashlib
from contextvars import ContextVar
from dataclasses import dataclass

DEFAULT = "default"


@dataclass(frozen=True)
class Principal:
    id: str  # the owner of what this caller creates
    reads: frozenset[str]  # the owners whose rows this caller sees (id included)
    anonymous: bool = False  # proved nothing although the server has a key (an open webhook)

    def can_read(self, owner: str | None) -> bool:
        return (owner or DEFAULT) in self.reads


OPEN = Principal(DEFAULT, frozenset({DEFAULT}))


def key_principal(key: str) -> Principal:
    pid = "key:" + hashlib.sha256(key.encode()).hexdigest()[:16]
    return Principal(pid, frozenset({pid, DEFAULT}))


def webhook_principal(assistant_id: str, *, anonymous: bool = False) -> Principal:
    pid = f"webhook:{assistant_id}"
    return Principal(pid, frozenset({pid}), anonymous=anonymous)


# the caller of the request being served, set by app.deps.require_api_key on every /v1 route: the
# chat-completions session store (app.memory.conversation) reads it from there
_current: ContextVar[Principal] = ContextVar("chatloom_principal", default=OPEN)


def set_current(principal: Principal) -> None:
    _current.set(principal)


def current() -> Principal:
    return _current.get()
