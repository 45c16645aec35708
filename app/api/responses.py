"""POST /v1/responses (n8n's default path), streaming with typed events or one JSON object."""

from __future__ import annotations

import json
import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.api.openai import sse_response
from app.chat import responses as convert
from app.chat.chunks import cut_short
from app.chat.generation import new_id, sampling_fields
from app.chat.messages import check_tools
from app.chat.serving import Prepared, Serving
from app.deps import ApiKey, ServingDep
from app.errors import APIError
from app.schemas.responses import Response, ResponsesRequest

router = APIRouter(dependencies=[ApiKey], tags=["responses"])
log = logging.getLogger("chatloom.responses")


async def _prepare(serving: Serving, body: ResponsesRequest) -> Prepared:
    model = serving.model_name(body.model)
    try:
        return await _prepare_chat(serving, body, model)
    except APIError as exc:
        if exc.param == "max_tokens":  # this API's name for it
            exc.param = "max_output_tokens"
            exc.message = exc.message.replace("max_tokens", "max_output_tokens")
        raise


async def _prepare_chat(serving: Serving, body: ResponsesRequest, model: str) -> Prepared:
    messages = convert.input_messages(body)
    tools = convert.chat_tools(body)
    tool_choice = convert.chat_tool_choice(body)
    check_tools(tools, tool_choice)
    return await serving.prepare(
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        response_format=convert.response_format(body),
        max_tokens=body.max_output_tokens,
        fields=sampling_fields(body, serving.vocab_size),
        top_logprobs=None,
        model=model,
        request_id=new_id("resp"),
    )


def _event(data: dict) -> bytes:
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {data['type']}\ndata: {payload}\n\n".encode()


@router.post(
    "/v1/responses",
    responses={200: {"model": Response, "description": "JSON, or typed SSE events with stream"}},
)
@router.post("/responses", include_in_schema=False)
async def create_response(body: ResponsesRequest, request: Request, serving: ServingDep):
    prep = await _prepare(serving, body)
    builder = convert.ResponseBuilder(body, prep.model, prep.params.max_tokens)
    if not body.stream:
        choices, run = await serving.collect(prep, request)
        choice = choices[0]
        builder.feed(choice.events)
        status = "incomplete" if choice.engine_reason == "length" else "completed"
        usage = builder.usage(run.prompt_tokens, run.completion_tokens, run.cached_tokens)
        builder.finish(status, usage)
        return JSONResponse(builder.response(status, usage))

    async def stream():
        run = serving.run(prep)
        parser = serving.parsers(prep)[0]
        try:
            for ev in builder.start():
                yield _event(ev)
            reason = None
            cut = False
            n_tokens = 0
            async for out in run:
                n_tokens += len(out.new_token_ids)
                events = parser.feed(out.text_delta)
                if out.finish_reason is not None:
                    reason = out.finish_reason
                    cut = cut_short(prep.params, reason, out.stop_reason, n_tokens)
                    events += parser.finish()
                for ev in builder.feed(events):
                    yield _event(ev)
            status = "incomplete" if reason == "length" or cut else "completed"
            usage = builder.usage(run.prompt_tokens, run.completion_tokens, run.cached_tokens)
            for ev in builder.finish(status, usage):
                yield _event(ev)
        except APIError as exc:  # logged where it was found (e.g. the store went down)
            yield _event(builder.event("error", message=exc.message, code=exc.code, param=exc.param))
        except Exception as exc:
            log.exception("error while streaming %s", prep.request_id)
            message = f"Internal error while generating: {type(exc).__name__}"
            yield _event(builder.event("error", message=message, code="server_error", param=None))
        finally:
            await run.close()

    return sse_response(stream())
