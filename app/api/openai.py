"""OpenAI-compatible surface: chat completions, completions, models (with and without /v1)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from app.admission import hold
from app.chat.chunks import SSE_DONE, sse
from app.chat.generation import (
    EngineRun,
    check_context,
    finite_logprob,
    make_params,
    new_id,
    sampling_fields,
    watch_disconnect,
)
from app.chat.serving import rejected_as_400
from app.deps import ApiKey, ServingDep
from app.errors import APIError
from app.schemas.chat import ChatCompletion, ChatCompletionRequest
from app.schemas.common import Model, ModelList
from app.schemas.completions import Completion, CompletionRequest

router = APIRouter(dependencies=[ApiKey], tags=["openai"])

# streamed bodies (SSE, NDJSON): no caching, no proxy buffering
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_response(body) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream", headers=STREAM_HEADERS)


@router.get("/v1/models", response_model=ModelList)
@router.get("/models", response_model=ModelList, include_in_schema=False)
async def list_models(serving: ServingDep) -> ModelList:
    return ModelList(
        data=[Model(id=serving.served_name, created=serving.created, max_model_len=serving.max_model_len)]
    )


@router.get("/v1/models/{model_id:path}", response_model=Model)
@router.get("/models/{model_id:path}", response_model=Model, include_in_schema=False)
async def get_model(model_id: str, serving: ServingDep) -> Model:
    if model_id != serving.served_name and serving.settings.strict_model_names:
        raise APIError(f"The model {model_id!r} does not exist.", 404, param="model", code="model_not_found")
    return Model(id=model_id, created=serving.created, max_model_len=serving.max_model_len)


_CHAT_DOC = {200: {"model": ChatCompletion, "description": "JSON, or SSE ChatCompletionChunks with stream"}}
_CMPL_DOC = {200: {"model": Completion, "description": "JSON, or SSE chunks (Completion) with stream"}}


@router.post("/v1/chat/completions", responses=_CHAT_DOC)
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(body: ChatCompletionRequest, request: Request, serving: ServingDep):
    session_id = request.headers.get("x-session-id") or body.session_id
    if session_id is not None and not 1 <= len(session_id) <= 255:
        # the header is not in the body model; the column is VARCHAR(255)
        raise APIError("X-Session-Id must be 1 to 255 characters long.", param="session_id")
    prep = await serving.prepare_chat(body, session_id, getattr(request.app.state, "db", None))
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return sse_response(serving.chat_stream(prep, include_usage))
    return JSONResponse(await serving.chat_completion(prep, request))


# ---- legacy completions --------------------------------------------------------------------------


@router.post("/v1/completions", responses=_CMPL_DOC)
@router.post("/completions", include_in_schema=False)
async def completions(body: CompletionRequest, request: Request, serving: ServingDep):
    model = serving.model_name(body.model)
    serving.check_n(body.n)
    if body.suffix:
        raise APIError("suffix is not supported.", param="suffix")
    if isinstance(body.prompt, list) and body.prompt and isinstance(body.prompt[0], str):
        prompt_text: str | None = body.prompt[0]
    elif isinstance(body.prompt, str):
        prompt_text = body.prompt
    else:
        prompt_text = None
    if prompt_text is not None:
        # off the event loop: a long prompt takes seconds to tokenize, other requests stream meanwhile
        prompt_ids = await asyncio.to_thread(serving.renderer.encode, prompt_text)
    else:
        prompt_ids = list(body.prompt)  # type: ignore[arg-type]
        if any(not 0 <= t < serving.vocab_size for t in prompt_ids):
            raise APIError("prompt token ids must be inside the vocabulary.", param="prompt")
    if not prompt_ids:
        raise APIError("prompt must not be empty.", param="prompt")
    max_tokens = check_context(
        len(prompt_ids),
        body.max_tokens,
        serving.max_model_len,
        "prompt",
        default=serving.settings.default_max_tokens,
    )
    params = make_params(
        **sampling_fields(body, serving.vocab_size), max_tokens=max_tokens, logprobs=body.logprobs
    )
    rid = new_id("cmpl")
    created = int(time.time())
    echo = await asyncio.to_thread(serving.tokenizer.decode, prompt_ids) if body.echo else ""
    run = EngineRun(serving.engine, prompt_ids, params, rid, serving.metrics)
    # 429 beyond the caller's share, as chat completions; released when the response ends (or run goes)
    lease = hold(serving, run, body.n, len(prompt_ids))
    base = {"id": rid, "object": "text_completion", "created": created, "model": model}
    want_lp = body.logprobs is not None

    def lp_block(items: list[Any], offset: int) -> dict[str, Any]:
        tokens, lps, tops, offsets = [], [], [], []
        for item in items:
            text, _ = serving.token_text(item.token_id)
            tokens.append(text)
            lps.append(finite_logprob(item.logprob))
            tops.append(
                {serving.token_text(t)[0]: finite_logprob(lp) for t, lp in (item.top or [])[: body.logprobs]}
            )
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}

    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        async def stream():
            offsets = [len(echo)] * body.n
            try:
                if echo:
                    for i in range(body.n):
                        yield sse(_chunk(base, i, echo, None, None, include_usage))
                async for out in run:
                    lp = lp_block(out.logprobs or [], offsets[out.index]) if want_lp else None
                    offsets[out.index] += len(out.text_delta)
                    reason = (
                        "length" if out.finish_reason == "length" else ("stop" if out.finish_reason else None)
                    )
                    if out.text_delta or reason:
                        yield sse(_chunk(base, out.index, out.text_delta, reason, lp, include_usage))
                if include_usage:
                    yield sse({**base, "choices": [], "usage": _usage(run)})
                yield SSE_DONE
            finally:
                await run.close()
                lease.release()

        return sse_response(stream())

    texts = [[echo] for _ in range(body.n)]
    reasons: list[str | None] = [None] * body.n
    lps: list[list[Any]] = [[] for _ in range(body.n)]
    watcher = asyncio.create_task(watch_disconnect(request, run))
    try:
        async for out in rejected_as_400(run):
            texts[out.index].append(out.text_delta)
            lps[out.index] += out.logprobs or []
            if out.finish_reason:
                reasons[out.index] = "length" if out.finish_reason == "length" else "stop"
    finally:
        watcher.cancel()
        await run.close()
        lease.release()
    choices = [
        {
            "index": i,
            "text": "".join(texts[i]),
            "finish_reason": reasons[i] or "stop",
            "logprobs": lp_block(lps[i], len(echo)) if want_lp else None,
        }
        for i in range(body.n)
    ]
    return JSONResponse({**base, "choices": choices, "usage": _usage(run), "system_fingerprint": None})


def _chunk(base, index, text, reason, logprobs, include_usage) -> dict[str, Any]:
    body = {
        **base,
        "choices": [{"index": index, "text": text, "finish_reason": reason, "logprobs": logprobs}],
    }
    if include_usage:
        body["usage"] = None
    return body


def _usage(run: EngineRun) -> dict[str, Any]:
    return {
        "prompt_tokens": run.prompt_tokens,
        "completion_tokens": run.completion_tokens,
        "total_tokens": run.prompt_tokens + run.completion_tokens,
    }
