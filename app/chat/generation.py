"""One request's trip through the engine: sampling parameters from the wire fields, the context
check, streaming with metrics, and aborting in the engine when the client goes away."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from functools import lru_cache
from typing import Any

import anyio

from app.errors import APIError
from app.metrics import Metrics
from grammar.vocab import byte_decoder

log = logging.getLogger("chatloom.generation")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def check_context(
    prompt_len: int, max_tokens: int | None, max_model_len: int, param: str, default: int | None = None
) -> int:
    """The max_tokens to use; 400 when the request cannot fit. Not given: `default` (the server's
    cap, settings.default_max_tokens), never above what the context has left; no default: all of it."""
    if prompt_len >= max_model_len:
        raise APIError(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{prompt_len} tokens. Shorten the {param}.",
            param=param,
            code="context_length_exceeded",
        )
    if max_tokens is None:
        left = max_model_len - prompt_len
        return min(left, default) if default else left
    if prompt_len + max_tokens > max_model_len:
        raise APIError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} for the "
            "completion). Reduce the prompt or max_tokens.",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return max_tokens


def logit_bias_ids(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float]:
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise APIError(f"logit_bias keys must be token ids, got {key!r}.", param="logit_bias") from None
        if not 0 <= token < vocab_size:
            raise APIError(f"logit_bias token id {token} is outside the vocabulary.", param="logit_bias")
        out[token] = value
    return out


def sampling_fields(req: Any, vocab_size: int) -> dict[str, Any]:
    """SamplingParams fields from a chat, completions or Responses request (absent fields: defaults)."""

    def get(name: str) -> Any:
        return getattr(req, name, None)

    temperature = 1.0 if get("temperature") is None else get("temperature")
    top_p = 1.0 if get("top_p") is None else get("top_p")
    if top_p == 0.0:  # only the most likely token survives: greedy
        temperature, top_p = 0.0, 1.0
    stop = get("stop")
    fields: dict[str, Any] = dict(
        n=get("n") or 1,
        temperature=temperature,
        top_p=top_p,
        seed=get("seed"),
        stop=[stop] if isinstance(stop, str) else list(stop or []),
        frequency_penalty=get("frequency_penalty") or 0.0,
        presence_penalty=get("presence_penalty") or 0.0,
        logit_bias=logit_bias_ids(get("logit_bias"), vocab_size),
    )
    top_k = get("top_k")
    # 0 is "off" on the wire (-1 in the engine); k at least the vocabulary filters nothing
    if top_k is not None and top_k != 0 and top_k < vocab_size:
        fields["top_k"] = top_k
    for name in ("min_p", "repetition_penalty"):
        if get(name) is not None:
            fields[name] = get(name)
    return fields


def make_params(**fields: Any):
    from engine import SamplingParams

    try:
        return SamplingParams(**fields)
    except ValueError as exc:
        raise APIError(str(exc)) from exc


class EngineRun:
    """Iterates an engine request's StepOutputs, recording metrics; close() aborts it in the
    engine unless it finished (client gone, cancelled, or an error while sending)."""

    def __init__(
        self,
        engine: Any,
        prompt: list[int],
        params: Any,
        request_id: str,
        metrics: Metrics | None,
        retention_key: str | None = None,
    ) -> None:
        self.engine = engine
        self.prompt = prompt
        self.params = params
        self.request_id = request_id
        self.metrics = metrics
        self.retention_key = retention_key
        self.finished = False
        self._gen = None
        self._start = time.perf_counter()
        self._last: dict[int, float] = {}  # sample index -> time of its last token
        self.completion_tokens = 0
        self.prompt_tokens = len(prompt)
        self.cached_tokens = 0

    async def __aiter__(self) -> AsyncIterator[Any]:
        self._gen = self.engine.generate(
            self.prompt, self.params, request_id=self.request_id, retention_key=self.retention_key
        )
        first = True
        async for out in self._gen:
            now = time.perf_counter()
            if out.new_token_ids:
                count = len(out.new_token_ids)
                self.completion_tokens += count
                if self.metrics is not None:
                    self.metrics.generation_tokens.inc(count)  # live: aborted requests count too
                    if first:
                        self.metrics.prompt_tokens.inc(out.prompt_tokens or self.prompt_tokens)
                        self.metrics.ttft.observe(now - self._start)
                    elif out.index in self._last:
                        self.metrics.itl.observe((now - self._last[out.index]) / count)
                first = False
                self._last[out.index] = now
            if out.prompt_tokens:
                self.prompt_tokens = out.prompt_tokens
            self.cached_tokens = max(self.cached_tokens, out.cached_tokens or 0)
            yield out
        self.finished = True
        if self.metrics is not None:
            self.metrics.e2e.observe(time.perf_counter() - self._start)

    async def abort(self) -> None:
        """Stop the request in the engine (safe from another task; shielded from cancellation)."""
        with anyio.CancelScope(shield=True):
            if not self.finished:
                log.info("aborting request %s", self.request_id)
                try:
                    await self.engine.abort(self.request_id)
                except Exception:
                    log.exception("abort of %s failed", self.request_id)

    async def close(self) -> None:
        """From the consuming task, when done with the run: abort unless finished, free the stream."""
        await self.abort()
        if self._gen is not None and not self._gen.ag_running:
            with anyio.CancelScope(shield=True):
                await self._gen.aclose()


async def watch_disconnect(request: Any, run: EngineRun, interval: float = 0.2) -> None:
    """For non-streaming answers: abort the engine request when the client disconnects."""
    while not run.finished:
        if await request.is_disconnected():
            log.info("client of %s disconnected", run.request_id)
            await run.abort()
            return
        await asyncio.sleep(interval)


# ---- token text for logprobs ---------------------------------------------------------------------


@lru_cache(maxsize=1)
class TokenText:
    """token id -> (text, utf-8 bytes) for logprobs, cached per tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}
        self._special = set(getattr(tokenizer, "all_special_ids", []) or [])
        self._decoder = byte_decoder()  # built anew on each call of byte_decoder()

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is not None:
            return hit
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        decoder = self._decoder
        if piece is not None and token_id not in self._special and all(ch in decoder for ch in piece):
            raw = bytes(decoder[ch] for ch in piece)
        else:
            raw = self.tokenizer.decode([token_id]).encode("utf-8")
        hit = (raw.decode("utf-8", errors="replace"), list(raw))
        self._cache[token_id] = hit
        return hit

    def chat_logprobs(self, items: list[Any], top_n: int) -> list[dict[str, Any]]:
        """engine TokenLogprobs -> openai ChatCompletionTokenLogprob dicts."""
        out = []
        for item in items:
            text, raw = self(item.token_id)
            tops = []
            for tid, lp in (item.top or [])[:top_n]:
                t_text, t_raw = self(tid)
                tops.append({"token": t_text, "bytes": t_raw, "logprob": finite_logprob(lp)})
            logprob = finite_logprob(item.logprob)
            out.append({"token": text, "bytes": raw, "logprob": logprob, "top_logprobs": tops})
        return out


def finite_logprob(value: float) -> float:
    # JSON has no -inf; a masked-out token gets the most negative float the SDK parses
    return value if value > -1e30 else -9999.0
