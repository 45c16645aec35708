"""One assistant turn: store the user message, replay the history, generate, run tool calls as
webhooks for a bounded number of rounds, store every message as soon as it exists.

run_turn yields the text the user sees, piece by piece (tool-call text is never shown); the pieces
joined equal the turn's assistant contents joined, and every message is committed before the
generator ends (so before a JSON reply is sent or an NDJSON stream's "end" line). A turn the client
stops (its stream cancelled or closed) keeps the text it had shown as the assistant's reply."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, fields
from typing import Any

import anyio
import httpx

from app.agent import replay
from app.agent.refusal import end_if_refused
from app.agent.targets import TargetPolicy
from app.agent.usage import TurnUsage
from app.agent.webhooks import ToolResult, call_webhook
from app.chat.constraints import build_constraint, copy_processors
from app.chat.tool_events import CallArgs, CallStart, Content, ParsedCall
from app.chat.tool_parser import ToolCallParser
from app.errors import APIError
from app.memory import repository as repo
from app.memory.db import Database
from app.principal import OPEN, Principal
from grammar.dialects import dialect_for
from runner.sampling_params import SamplingParams

log = logging.getLogger("chatloom.agent")

MAX_TOOL_ROUNDS = 4  # model calls that may end in tool calls; one more answers without tools
DEFAULT_MAX_TOKENS = 512
DEFAULT_MAX_TURNS = 50
_SAMPLING_KEYS = {f.name for f in fields(SamplingParams)} - {
    "n",
    "constraint",
    "logits_processors",
    "logprobs",
    "skip_special_tokens",
}


@dataclass
class AssistantSpec:
    """A plain snapshot of an assistants row (no ORM object outlives its session)."""

    id: str
    name: str = ""
    system_prompt: str = ""
    model: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    tool_choice: Any = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    webhook_auth: dict[str, Any] | None = None  # None: the server's CHATLOOM_WEBHOOK_AUTH
    anonymous_tools: bool = False

    @classmethod
    def from_row(cls, row) -> AssistantSpec:
        return cls(
            row.id,
            row.name,
            row.system_prompt or "",
            row.model,
            dict(row.sampling or {}),
            dict(row.memory or {}),
            row.tool_choice,
            list(row.tools or []),
            dict(row.webhook_auth) if row.webhook_auth else None,
            bool(row.anonymous_tools),
        )

    def model_tools(self) -> list[dict]:
        """The tools as the model sees them (OpenAI function form, no webhook details)."""
        return [{"type": "function", "function": t["function"]} for t in self.tools if "function" in t]

    def webhook_for(self, name: str) -> dict | None:
        for t in self.tools:
            if t.get("function", {}).get("name") == name:
                return t.get("webhook") or {}
        return None


@dataclass
class TurnDeps:
    engine: Any  # engine.AsyncEngine (or anything with .tokenizer, .generate, .abort)
    db: Database
    http: httpx.AsyncClient
    targets: TargetPolicy = field(default_factory=TargetPolicy)  # where webhook tools may connect
    # the app's per-caller shares (app.admission.Admission); None: unlimited
    admission: Any = None
    copy_bias: float = 0.0  # Settings.copy_bias (grammar/copying.py); 0: off


_session_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()


def session_lock(session_id: str) -> asyncio.Lock:
    """Turns of one session run one at a time (in this process): each replays the last."""
    lock = _session_locks.get(session_id)
    if lock is None:
        lock = _session_locks[session_id] = asyncio.Lock()
    return lock


def _stop_ids(tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id}
    for tok in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != getattr(tokenizer, "unk_token_id", None):
            ids.add(tid)
    return {i for i in ids if i is not None}


def _max_model_len(engine) -> int | None:
    for owner in (engine, getattr(engine, "config", None)):
        value = getattr(owner, "max_model_len", None)
        if isinstance(value, int):
            return value
    return None


def _apply(events: list, content: list[str], calls: list[ParsedCall]) -> list[str]:
    """Fold parser events into content pieces and calls; returns the new visible pieces."""
    shown = []
    for ev in events:
        if isinstance(ev, Content):
            content.append(ev.text)
            shown.append(ev.text)
        elif isinstance(ev, CallStart):
            calls.append(ParsedCall(ev.id, ev.name, ""))
        elif isinstance(ev, CallArgs):
            calls[ev.index].arguments += ev.fragment
    return shown


@dataclass
class _Round:
    """What one model call produced (filled while its text streams)."""

    content: list[str] = field(default_factory=list)
    calls: list[ParsedCall] = field(default_factory=list)
    token_ids: list[int] | None = field(default_factory=list)  # stop token excluded; None: don't replay


async def _generate(
    engine,
    prompt_ids: list[int],
    params: SamplingParams,
    session_id: str,
    parse_calls: bool,
    stops: set[int],
    result: _Round,
    usage: TurnUsage,
) -> AsyncIterator[str]:
    """Run one model call; yields the visible text pieces and fills `result` and `usage`."""
    request_id = f"turn-{uuid.uuid4().hex}"
    # the API's streaming parser: Content events are what the user sees, call markup never is
    parser = ToolCallParser(enabled=parse_calls, fmt=dialect_for(engine.tokenizer))
    ids: list[int] = []
    stop_reason = None
    finished = False
    try:
        stream = engine.generate(prompt_ids, params, request_id=request_id, retention_key=session_id)
        usage.prompt_tokens = len(prompt_ids)
        async for out in stream:
            if out.new_token_ids:
                usage.tokens(len(out.new_token_ids))
            ids.extend(out.new_token_ids)
            stop_reason = out.stop_reason if out.finish_reason else stop_reason
            for piece in _apply(parser.feed(out.text_delta), result.content, result.calls):
                yield piece
        finished = True
    except ValueError as exc:  # the engine refused the request (too long, bad parameters)
        finished = True
        raise APIError(f"The model could not run this turn: {exc}") from exc
    finally:
        if not finished:  # the client went away mid-generation
            await engine.abort(request_id)
    for piece in _apply(parser.finish(), result.content, result.calls):
        yield piece
    while ids and ids[-1] in stops:
        ids.pop()
    # a stop string is cut from the text, not from the ids: such a reply is replayed as text
    result.token_ids = None if isinstance(stop_reason, str) else ids


async def _run_tool(deps: TurnDeps, spec: AssistantSpec, call: ParsedCall) -> ToolResult:
    webhook = spec.webhook_for(call.name)
    if webhook is None:
        return ToolResult(json.dumps({"error": f"unknown tool {call.name!r}"}), ok=False)
    try:
        args = json.loads(call.arguments)
    except ValueError as exc:
        return ToolResult(json.dumps({"error": f"arguments are not JSON: {exc}"}), ok=False)
    return await call_webhook(deps.http, webhook, args, deps.targets)


async def run_turn(
    deps: TurnDeps,
    spec: AssistantSpec,
    session_id: str,
    user_text: str,
    *,
    max_tool_rounds: int = MAX_TOOL_ROUNDS,
    principal: Principal = OPEN,
    usage: TurnUsage | None = None,
) -> AsyncIterator[str]:
    """principal: the caller; a session id another caller holds is a 404 (nothing read or written).
    usage: filled as the turn runs. A turn stopped by its client (cancelled, or closed early)
    stores the text it had shown so far as the assistant's reply, and the next turn follows it. A
    turn that fails, or is stopped before it showed any text, takes its user message back out of
    the session (a retry does not find the question twice)."""
    async with session_lock(session_id):
        unanswered: list[int] = []  # the user message's id until a reply is stored
        shown: list[str] = []  # the current model call's visible text until it is stored
        try:
            async for piece in _run_turn_locked(
                deps,
                spec,
                session_id,
                user_text,
                max_tool_rounds,
                principal,
                unanswered,
                usage or TurnUsage(),
                shown,
            ):
                yield piece
        except BaseException as exc:
            stopped = isinstance(exc, asyncio.CancelledError | GeneratorExit)
            if stopped and "".join(shown).strip():
                await _keep_partial(deps.db, session_id, "".join(shown))
            elif unanswered:
                await _forget(deps.db, session_id, unanswered)
            raise


async def _keep_partial(db: Database, session_id: str, text: str) -> None:
    """Store a stopped reply's text (replayed as text: its token ids may run past what was shown)."""
    with anyio.CancelScope(shield=True):  # runs while the request's task is being cancelled
        try:
            async with db.session() as s:
                await repo.add_message(s, db.history, session_id, "assistant", text)
        except APIError as exc:
            log.warning("could not store the stopped reply of %s: %s", session_id, exc)


async def _forget(db: Database, session_id: str, message_ids: list[int]) -> None:
    from app.memory.conversation import forget

    with anyio.CancelScope(shield=True):  # runs while the request's task is being cancelled
        try:
            await forget(db, session_id, message_ids)
        except APIError as exc:  # the store is down: its own log line says so
            log.warning("could not remove the failed turn's message of %s: %s", session_id, exc)


async def _run_turn_locked(
    deps: TurnDeps,
    spec: AssistantSpec,
    session_id: str,
    user_text: str,
    max_tool_rounds: int,
    principal: Principal,
    unanswered: list[int] | None = None,
    usage: TurnUsage | None = None,
    shown: list[str] | None = None,
) -> AsyncIterator[str]:
    usage = usage or TurnUsage()
    shown = [] if shown is None else shown
    engine, db = deps.engine, deps.db
    tokenizer = engine.tokenizer
    async with db.session() as s:
        await repo.claim_session(s, db.history, session_id, principal, spec.id)
        user_row = await repo.add_message(s, db.history, session_id, "user", user_text)
    if unanswered is not None:
        unanswered.append(user_row.id)
    stored = [user_row.id]  # this turn's messages: a turn ended by a refused tool target takes them back
    refused_tools: set[str] = set()
    async with db.session() as s:
        history = [m.to_replay() for m in await repo.get_messages(s, db.history, session_id)]

    sampling = {k: v for k, v in spec.sampling.items() if k in _SAMPLING_KEYS}
    sampling.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    stops = _stop_ids(tokenizer)
    sampling["stop_token_ids"] = sorted(stops | set(sampling.get("stop_token_ids", [])))
    tools = spec.model_tools()
    # the logits' width (padded embedding rows included) for the grammar's token mask
    vocab_size = getattr(getattr(engine, "model_config", None), "vocab_size", None)
    max_turns = spec.memory.get("max_turns", None if spec.memory.get("max_tokens") else DEFAULT_MAX_TURNS)
    budget = spec.memory.get("max_tokens")
    if (limit := _max_model_len(engine)) is not None:
        room = limit - sampling["max_tokens"]
        budget = min(budget, room) if budget else room

    for round_index in range(max_tool_rounds + 1):
        if round_index == max_tool_rounds:
            choice = "none"
        else:
            choice = spec.tool_choice if round_index == 0 else "auto"
        kept = replay.trim(history, max_turns)
        render = {"system_prompt": spec.system_prompt, "tools": tools or None}
        if budget:
            # rendering and tokenizing a long history takes seconds: off the event loop
            kept, prompt_ids = await asyncio.to_thread(replay.fit_tokens, tokenizer, kept, budget, **render)
        else:
            prompt_ids = await asyncio.to_thread(replay.render_ids, tokenizer, kept, **render)
        # grammar.api through the API's adapter (compiled off the event loop; None without a backend)
        constraint = await build_constraint(
            tokenizer,
            tools=tools or None,
            tool_choice=choice or "auto",
            parallel_tool_calls=True,
            response_format=None,
            max_tokens=sampling["max_tokens"],
            vocab_size=vocab_size,
        )
        # tool-call tags are added tokens that decode() drops when skipping specials; stop
        # tokens are never detokenized, so nothing else special shows up in the text
        copying = copy_processors(
            tokenizer,
            constraint is not None and bool(tools) and choice != "none",
            sources=[{"role": "system", "content": spec.system_prompt}, *kept],
            dialect=dialect_for(tokenizer),
            vocab_size=vocab_size,
            strength=deps.copy_bias,
        )
        params = SamplingParams(
            **sampling, constraint=constraint, logits_processors=copying, skip_special_tokens=False
        )

        made = _Round()
        shown.clear()
        parse_calls = bool(tools) and choice != "none"
        # the caller's share of sequences and prompt tokens (app.admission) for this model call: 429 beyond
        lease = deps.admission.acquire(principal.id, 1, len(prompt_ids)) if deps.admission else None
        try:
            async for piece in _generate(
                engine, prompt_ids, params, session_id, parse_calls, stops, made, usage
            ):
                shown.append(piece)
                yield piece
        finally:
            if lease is not None:
                lease.release()

        text, calls = "".join(made.content), made.calls
        openai_calls = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ] or None
        async with db.session() as s:
            row = await repo.add_message(
                s,
                db.history,
                session_id,
                "assistant",
                text,
                tool_calls=openai_calls,
                token_ids=made.token_ids,
            )
            stored.append(row.id)
        shown.clear()  # stored: a stop from here on has nothing more to keep
        if unanswered is not None:
            unanswered.clear()  # answered: the user message stays whatever happens next
        history.append(
            {"role": "assistant", "content": text, "tool_calls": openai_calls, "token_ids": made.token_ids}
        )
        if not calls:
            return

        results = await asyncio.gather(*(_run_tool(deps, spec, c) for c in calls))
        end_if_refused(calls, results, choice, refused_tools, stored, unanswered)
        async with db.session() as s:
            for call, result in zip(calls, results, strict=True):
                await repo.add_message(
                    s,
                    db.history,
                    session_id,
                    "tool",
                    result.content,
                    tool_call_id=call.id,
                    name=call.name or None,
                )
        for call, result in zip(calls, results, strict=True):
            history.append(
                {
                    "role": "tool",
                    "content": result.content,
                    "tool_call_id": call.id,
                    "name": call.name or None,
                }
            )
