"""Chat completions over the engine: request -> prompt ids + SamplingParams -> JSON or SSE chunks.
The Responses API reuses prepare() with its own input conversion. The request's messages are
app.chat.messages' conversion, the wire's chunks and choices app.chat.chunks'."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio

from app.admission import admit
from app.chat.chunks import SSE_DONE, Choice, cut_short, deltas, finish_reason, sse
from app.chat.constraints import build_constraint, copy_processors
from app.chat.generation import (
    EngineRun,
    TokenText,
    check_context,
    make_params,
    new_id,
    sampling_fields,
    watch_disconnect,
)
from app.chat.messages import chat_messages, check_tools, session_messages
from app.chat.template import ChatMessage, PromptRenderer
from app.chat.tool_parser import ToolCallParser
from app.errors import APIError, error_body
from app.metrics import Metrics
from app.schemas.chat import (
    ChatCompletionRequest,
    NamedToolChoice,
)
from app.settings import Settings

log = logging.getLogger("chatloom.serving")


@dataclass
class Prepared:
    request_id: str
    prompt_ids: list[int]
    params: Any  # engine.SamplingParams
    parse_tools: bool
    top_logprobs: int | None  # None: no logprobs asked
    model: str
    created: int = field(default_factory=lambda: int(time.time()))
    session_id: str | None = None  # server-side memory: the reply is stored under it
    db: Any = None  # app.memory's Database when session memory is on
    # ids of the request's messages stored for this turn: removed again when the turn fails
    stored_ids: list[int] = field(default_factory=list)
    remembered: bool = False

    async def forget_turn(self) -> None:
        """The turn failed or was abandoned: its new messages leave the session (shielded: this
        runs while the request's task is being cancelled)."""
        if self.remembered or not self.stored_ids or self.db is None or self.session_id is None:
            return
        from app.memory.conversation import forget

        ids, self.stored_ids = self.stored_ids, []
        with anyio.CancelScope(shield=True):
            try:
                await forget(self.db, self.session_id, ids)
            except APIError as exc:  # the store is down: its own log line says so
                log.warning("could not remove the failed turn's messages of %s: %s", self.session_id, exc)


class Serving:
    def __init__(self, engine: Any, settings: Settings, metrics: Metrics | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.tokenizer = engine.tokenizer
        self.renderer = PromptRenderer(self.tokenizer)
        self.token_text = TokenText(self.tokenizer)
        self.max_model_len: int = engine.max_model_len
        self.vocab_size = len(self.tokenizer)
        model_config = getattr(engine, "model_config", None)
        self.model_vocab_size: int | None = getattr(model_config, "vocab_size", None)
        self.served_name = settings.model_name()
        self.created = int(time.time())  # the model's `created` in /v1/models
        self._special_ids = set(getattr(self.tokenizer, "all_special_ids", []) or [])

    def _render_ids(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None) -> list[int]:
        return self.renderer.encode(self.renderer.render(messages, tools))

    def model_name(self, requested: str | None) -> str:
        if requested and self.settings.strict_model_names and requested != self.served_name:
            raise APIError(
                f"The model {requested!r} does not exist; this server serves {self.served_name!r}.",
                404,
                param="model",
                code="model_not_found",
            )
        return requested or self.served_name

    def check_n(self, n: int) -> None:
        if n > self.settings.max_n:
            raise APIError(f"n must be at most {self.settings.max_n}, got {n}.", param="n")

    async def prepare(
        self,
        *,
        messages: list[ChatMessage],
        tools: list[dict[str, Any]] | None,
        tool_choice: Any,
        parallel_tool_calls: bool,
        response_format: dict[str, Any] | None,
        max_tokens: int | None,
        fields: dict[str, Any],
        top_logprobs: int | None,
        model: str,
        request_id: str,
        history: list[dict[str, Any]] | None = None,
    ) -> Prepared:
        """history: a stored conversation (app.memory) rendered instead of `messages`. The caller
        has run check_tools(tools, tool_choice)."""
        if tool_choice is None:
            tool_choice = "auto" if tools else "none"
        use_tools = tools if tools and tool_choice != "none" else None
        if history is not None:
            from app.agent.replay import render_ids  # splices stored reply ids: the prefix cache stays warm

            prompt_ids = await asyncio.to_thread(render_ids, self.tokenizer, history, tools=use_tools)
        else:
            # a long history takes tens of ms to render and tokenize: off the event loop, which
            # is streaming other requests meanwhile
            prompt_ids = await asyncio.to_thread(self._render_ids, messages, use_tools)
        max_tokens = check_context(
            len(prompt_ids),
            max_tokens,
            self.max_model_len,
            "messages",
            default=self.settings.default_max_tokens,
        )
        constraint = await build_constraint(
            self.tokenizer,
            # with tool_choice "none" the grammar still keeps call markup out of the text
            tools=tools or None,
            tool_choice=tool_choice,
            parallel_tool_calls=parallel_tool_calls,
            response_format=response_format,
            max_tokens=max_tokens,
            vocab_size=self.model_vocab_size,
            dialect=self.renderer.dialect,
            timeout_s=self.settings.grammar_timeout_s,
        )
        copying = copy_processors(
            self.tokenizer,
            constraint is not None and use_tools is not None,
            sources=history if history is not None else messages,
            dialect=self.renderer.dialect,
            vocab_size=self.model_vocab_size,
            strength=self.settings.copy_bias,
        )
        params = make_params(
            **fields,
            max_tokens=max_tokens,
            logprobs=top_logprobs,
            constraint=constraint,
            logits_processors=copying,
            # the tool-call tags are added tokens, which decoding drops when skipping specials;
            # stop tokens are never detokenized, so nothing else special reaches the text
            skip_special_tokens=use_tools is None,
        )
        prep = Prepared(request_id, prompt_ids, params, use_tools is not None, top_logprobs, model)
        admit(self, prep)  # 429 beyond the caller's share of sequences and prompt tokens
        return prep

    async def prepare_chat(
        self, req: ChatCompletionRequest, session_id: str | None = None, db: Any = None
    ) -> Prepared:
        """session_id with a conversation store (db): the request's new messages are appended to
        the stored conversation, which is what the model sees; the reply is stored at the end."""
        model = self.model_name(req.model)
        self.check_n(req.n)
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError("top_logprobs requires logprobs to be true.", param="top_logprobs")
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        tool_choice = (
            req.tool_choice.model_dump() if isinstance(req.tool_choice, NamedToolChoice) else req.tool_choice
        )
        check_tools(tools, tool_choice)  # before anything is stored in a session
        response_format = req.response_format.model_dump(by_alias=True) if req.response_format else None
        history = None
        fields = sampling_fields(req, self.vocab_size)  # its 400s come before anything is stored
        stored_ids: list[int] = []
        if session_id is not None and db is not None:
            from app.memory.conversation import load_and_append

            history = await load_and_append(db, session_id, session_messages(req), added=stored_ids)
        else:
            session_id = None
        try:
            prep = await self.prepare(
                messages=chat_messages(req),
                tools=tools,
                tool_choice=tool_choice,
                parallel_tool_calls=req.parallel_tool_calls is not False,
                response_format=response_format,
                max_tokens=req.max_completion_tokens or req.max_tokens,
                fields=fields,
                top_logprobs=(req.top_logprobs or 0) if req.logprobs else None,
                model=model,
                request_id=new_id("chatcmpl"),
                history=history,
            )
        except BaseException:
            if stored_ids:  # e.g. the conversation no longer fits the context: nothing was answered
                failed = Prepared("", [], None, False, None, model, session_id=session_id, db=db)
                failed.stored_ids = stored_ids
                await failed.forget_turn()
            raise
        prep.session_id, prep.db, prep.stored_ids = session_id, db, stored_ids
        return prep

    def run(self, prep: Prepared) -> EngineRun:
        return EngineRun(
            self.engine,
            prep.prompt_ids,
            prep.params,
            prep.request_id,
            self.metrics,
            retention_key=prep.session_id,
        )

    async def remember(self, prep: Prepared, choice: Choice) -> None:
        """Store the reply (sample 0) in the session before the response completes."""
        if prep.session_id is None or prep.db is None:
            return
        from app.memory.conversation import record_reply

        ids: list[int] | None = list(choice.token_ids)
        if isinstance(choice.stop_reason, str):
            ids = None  # a stop string was cut from the text but not from the ids: store text only
        elif ids and (choice.stop_reason is not None or ids[-1] in self._special_ids):
            ids = ids[:-1]  # the stop token itself is not part of the reply
        await record_reply(
            prep.db, prep.session_id, "".join(choice.content), tool_calls=choice.calls or None, token_ids=ids
        )
        prep.remembered = True

    def parsers(self, prep: Prepared) -> list[ToolCallParser]:
        return [ToolCallParser(prep.parse_tools, self.renderer.tool_format) for _ in range(prep.params.n)]

    # ---- non-streaming -----------------------------------------------------------------------

    async def collect(self, prep: Prepared, request: Any) -> tuple[list[Choice], EngineRun]:
        run = self.run(prep)
        parsers = self.parsers(prep)
        choices = [Choice() for _ in parsers]
        watcher = asyncio.create_task(watch_disconnect(request, run)) if request is not None else None
        counts = [0] * len(parsers)
        try:
            async for out in rejected_as_400(run):
                counts[out.index] += len(out.new_token_ids)
                choice = choices[out.index]
                choice.token_ids += out.new_token_ids
                choice.add(parsers[out.index].feed(out.text_delta))
                if out.logprobs and prep.top_logprobs is not None:
                    choice.logprobs += self.token_text.chat_logprobs(out.logprobs, prep.top_logprobs)
                if out.finish_reason is not None:
                    choice.engine_reason = out.finish_reason
                    choice.stop_reason = out.stop_reason
                    choice.add(parsers[out.index].finish())
            if choices[0].engine_reason not in (None, "abort"):
                await self.remember(prep, choices[0])
        finally:
            if watcher is not None:
                watcher.cancel()
            await run.close()
            await prep.forget_turn()  # no reply stored: engine error, client gone, store down
        for i, (choice, parser) in enumerate(zip(choices, parsers, strict=True)):
            cut = cut_short(prep.params, choice.engine_reason, choice.stop_reason, counts[i])
            choice.engine_reason = finish_reason(choice.engine_reason, parser.made_calls, cut)
        return choices, run

    async def chat_completion(self, prep: Prepared, request: Any) -> dict[str, Any]:
        choices, run = await self.collect(prep, request)
        out_choices = []
        for i, c in enumerate(choices):
            text = "".join(c.content)
            message = {
                "role": "assistant",
                "content": (text or None) if c.calls else text,
                "refusal": None,
                "tool_calls": c.calls or None,
            }
            logprobs = {"content": c.logprobs, "refusal": None} if prep.top_logprobs is not None else None
            out_choices.append(
                {"index": i, "message": message, "finish_reason": c.engine_reason, "logprobs": logprobs}
            )
        return {
            "id": prep.request_id,
            "object": "chat.completion",
            "created": prep.created,
            "model": prep.model,
            "choices": out_choices,
            "usage": self.usage(run),
            "system_fingerprint": None,
        }

    @staticmethod
    def usage(run: EngineRun) -> dict[str, Any]:
        return {
            "prompt_tokens": run.prompt_tokens,
            "completion_tokens": run.completion_tokens,
            "total_tokens": run.prompt_tokens + run.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": run.cached_tokens},
        }

    # ---- streaming ---------------------------------------------------------------------------

    async def chat_stream(self, prep: Prepared, include_usage: bool) -> AsyncIterator[bytes]:
        run = self.run(prep)
        parsers = self.parsers(prep)
        base = {
            "id": prep.request_id,
            "object": "chat.completion.chunk",
            "created": prep.created,
            "model": prep.model,
        }
        pending_lp: list[list[dict[str, Any]]] = [[] for _ in parsers]  # logprobs not yet sent, per index
        want_lp = prep.top_logprobs is not None
        first = Choice()  # sample 0, accumulated for the session store
        counts = [0] * len(parsers)  # tokens per sample

        def chunk(index: int, delta: dict[str, Any], reason: str | None = None) -> bytes:
            logprobs = None
            if want_lp and (pending_lp[index] or reason is not None):
                logprobs = {"content": pending_lp[index], "refusal": None}
                pending_lp[index] = []
            body = {
                **base,
                "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}],
            }
            if include_usage:
                body["usage"] = None
            return sse(body)

        try:
            for i in range(len(parsers)):
                yield chunk(i, {"role": "assistant", "content": None})
            async for out in run:
                i = out.index
                counts[i] += len(out.new_token_ids)
                if want_lp and out.logprobs:
                    pending_lp[i] += self.token_text.chat_logprobs(out.logprobs, prep.top_logprobs or 0)
                events = parsers[i].feed(out.text_delta)
                if out.finish_reason is not None:
                    events += parsers[i].finish()
                if i == 0 and prep.session_id is not None:
                    first.add(events)
                    first.token_ids += out.new_token_ids
                    first.stop_reason = out.stop_reason
                    first.engine_reason = out.finish_reason or first.engine_reason
                for delta in deltas(events):
                    yield chunk(i, delta)
                if out.finish_reason is not None:
                    cut = cut_short(prep.params, out.finish_reason, out.stop_reason, counts[i])
                    yield chunk(i, {}, finish_reason(out.finish_reason, parsers[i].made_calls, cut))
            if first.engine_reason not in (None, "abort"):
                await self.remember(prep, first)
            if include_usage:
                yield sse({**base, "choices": [], "usage": self.usage(run)})
            yield SSE_DONE
        except APIError as exc:
            # the status line is already sent: report in-band, as OpenAI does (e.g. the store
            # went down before the reply was stored; that is logged where it was found)
            yield sse(exc.body())
            yield SSE_DONE
        except Exception as exc:
            log.exception("error while streaming %s", prep.request_id)
            yield sse(error_body(f"Internal error while generating: {type(exc).__name__}", "server_error"))
            yield SSE_DONE
        finally:
            await run.close()
            await prep.forget_turn()


async def rejected_as_400(run: EngineRun) -> AsyncIterator[Any]:
    """The engine raises ValueError when it refuses a request before generating (it checks what we
    cannot, e.g. a grammar's limits): that is the client's request, so a 400, not a 500."""
    started = False
    try:
        async for out in run:
            started = True
            yield out
    except ValueError as exc:
        if started:
            raise
        raise APIError(f"The engine rejected the request: {exc}") from exc
