"""Back-pressure per caller: how many sequences (a request's n samples each) and how many prompt
tokens one principal (app.principal: the API key, a webhook's credential, or the open server's
default caller) may have in the engine at once. Beyond either limit the request is answered 429
`rate_limit_exceeded` with `Retry-After`, before anything is generated, instead of queueing behind
itself and everyone else.

Limits (environment, CHATLOOM_ prefix like app.settings):
    CHATLOOM_MAX_SEQS_PER_PRINCIPAL           default: half of max_num_seqs
    CHATLOOM_MAX_QUEUED_TOKENS_PER_PRINCIPAL  prompt tokens of its requests in the engine; 262144
    CHATLOOM_RATE_LIMIT_RETRY_AFTER_S         the Retry-After answered; 1

A request holds its share from the moment its prompt is prepared (Serving.prepare calls admit(),
/v1/completions hold()) until its Prepared (or EngineRun) object is dropped, which happens when its
response has been sent or its stream has closed (a weakref finalizer: every exit path releases it,
errors included). A webhook turn (app.agent.turn) takes its caller's share for each model call and
gives it back when the call ends; its route checks the share first (check()), so that a caller
already at its limit gets the 429 before a stream starts."""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.errors import APIError

log = logging.getLogger("chatloom.admission")


class AdmissionSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CHATLOOM_", env_file=None, extra="ignore")

    max_seqs_per_principal: int | None = Field(default=None, ge=1)  # None: max_num_seqs // 2
    max_queued_tokens_per_principal: int = Field(default=262144, ge=1)
    rate_limit_retry_after_s: int = Field(default=1, ge=1)


class RateLimited(APIError):
    """429 with Retry-After (install() registers the handler that sends the header)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, 429, code="rate_limit_exceeded")
        self.retry_after_s = retry_after_s


@dataclass
class _Usage:
    seqs: int = 0
    tokens: int = 0


class Admission:
    """In-flight sequences and prompt tokens per principal id; thread-safe (finalizers may run
    anywhere)."""

    def __init__(self, max_seqs: int, max_tokens: int, retry_after_s: int = 1) -> None:
        self.max_seqs = max_seqs
        self.max_tokens = max_tokens
        self.retry_after_s = retry_after_s
        self._usage: dict[str, _Usage] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, max_num_seqs: int, settings: AdmissionSettings | None = None) -> Admission:
        s = settings or AdmissionSettings()
        max_seqs = s.max_seqs_per_principal or max(1, max_num_seqs // 2)
        return cls(max_seqs, s.max_queued_tokens_per_principal, s.rate_limit_retry_after_s)

    def usage(self, principal: str) -> tuple[int, int]:
        with self._lock:
            u = self._usage.get(principal)
            return (u.seqs, u.tokens) if u is not None else (0, 0)

    def acquire(self, principal: str, seqs: int, tokens: int) -> _Lease:
        """Take seqs sequences and tokens prompt tokens of the principal's share, or raise
        RateLimited. A single request larger than the whole share is refused too (it never fits)."""
        with self._lock:
            u = self._usage.setdefault(principal, _Usage())
            if u.seqs + seqs > self.max_seqs:
                message = (
                    f"Too many sequences in flight for this caller: {u.seqs} running and {seqs} asked "
                    f"(n), the limit is {self.max_seqs}. Retry after the running requests finish."
                )
            elif u.tokens + tokens > self.max_tokens:
                message = (
                    f"Too many prompt tokens queued for this caller: {u.tokens} in flight and {tokens} "
                    f"asked, the limit is {self.max_tokens}. Retry after the running requests finish."
                )
            else:
                u.seqs += seqs
                u.tokens += tokens
                return _Lease(self, principal, seqs, tokens)
            if not u.seqs and not u.tokens:
                del self._usage[principal]
        raise RateLimited(message, self.retry_after_s)

    def check(self, principal: str, seqs: int = 1, tokens: int = 0) -> None:
        """RateLimited if acquire(principal, seqs, tokens) would be refused now; takes nothing."""
        self.acquire(principal, seqs, tokens).release()

    def _release(self, principal: str, seqs: int, tokens: int) -> None:
        with self._lock:
            u = self._usage.get(principal)
            if u is None:
                return
            u.seqs -= seqs
            u.tokens -= tokens
            if u.seqs <= 0 and u.tokens <= 0:
                del self._usage[principal]


class _Lease:
    def __init__(self, admission: Admission, principal: str, seqs: int, tokens: int) -> None:
        self._args: tuple | None = (principal, seqs, tokens)
        self._admission = admission

    def release(self) -> None:
        args, self._args = self._args, None
        if args is not None:
            self._admission._release(*args)


def current_principal() -> str:
    """The caller of the request being served (app.principal, set by the API key dependency);
    'anonymous' where that module is absent."""
    try:
        from app.principal import current
    except ImportError:
        return "anonymous"
    return current().id


def admission_of(serving: Any) -> Admission:
    """The Admission of this app, made on first use; it lives on the Serving (one per app)."""
    admission = getattr(serving, "admission", None)
    if admission is None:
        admission = serving.admission = Admission.from_settings(serving.settings.max_num_seqs)
    return admission


def hold(serving: Any, holder: Any, seqs: int, tokens: int) -> _Lease:
    """Hold seqs sequences and tokens prompt tokens against the current caller's share until holder
    is dropped, or the lease returned is released, whichever comes first; 429 beyond it."""
    lease = admission_of(serving).acquire(current_principal(), seqs, tokens)
    weakref.finalize(holder, lease.release)
    return lease


def admit(serving: Any, prep: Any) -> None:
    """hold() prep's sequences (params.n) and prompt tokens until prep is dropped."""
    hold(serving, prep, prep.params.n, len(prep.prompt_ids))


async def _on_rate_limited(request: Request, exc: RateLimited) -> JSONResponse:
    return JSONResponse(
        exc.body(), status_code=exc.status_code, headers={"Retry-After": str(exc.retry_after_s)}
    )


def install(app: FastAPI) -> None:
    """The 429 handler that adds Retry-After (APIError's own handler sends no headers)."""
    app.add_exception_handler(RateLimited, _on_rate_limited)
