"""Seeded synthetic tool-use conversations in the shapes n8n's AI Agent sends, rendered into
(prompt, target) pairs through chatloom's own PromptRenderer, so that training sees exactly the text
the server will show the model: the tools and the call format written into the system prompt
(generic dialect), calls as `<tool_call>` text, results as `<tool_response>` user turns.

Kinds: call (one call), answer (a final answer grounded in the tool's result), parallel (two calls
in one turn), followup (a second request after a finished exchange), abstain (no tool fits: a plain
answer), nocall (a polite refusal when the asked-for tool is missing), chat (no tools at all).

Tools: hand-written (tool_bank.py), record actions (procedural.py) and lookups over many domains
(lookup_tools.py), none sharing a name or domain with heldout.py (checked at start). Past calls in
a prompt carry compact or spaced JSON arguments (clients send either back); a lone result value is
sometimes plain text, as n8n's Calculator returns it. Targets are always the grammar's compact JSON.

Round 4 adds the pattern tools (pattern_tools.py): request shapes the round-3 adapter got wrong on
held-out tools, on other domains: two values of one pool whose roles the words give in either order
of mention, a title followed by "in <city>" with the city its own parameter, names spoken with "the"
passed without it, carrier-like ids on other records (offered among tools of the same kin, so the
words pick the tool), and "say X in Morse code"-like requests that call the tool.

    python -m train.generate --n 3000 --seed 0 --out train/out/data.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from app.chat.template import ChatMessage, PromptRenderer, _calls_text
from grammar.dialects import GENERIC
from train.distill import load as distilled_answers
from train.heldout import heldout_tools
from train.lookup_tools import lookup_tools
from train.pattern_tools import pattern_tools
from train.procedural import record_tools
from train.tool_bank import hand_tools
from train.toolspec import Tool
from train.values import PLAIN_QA

END = "<|im_end|>"
SYSTEMS = [
    None,
    "You are a helpful assistant",
    "You are a helpful assistant",
    "You are a helpful assistant.",
    "You are an operations assistant for Acme Corp. Use the tools when they help.",
    "You are a concise assistant. Answer briefly.",
    "You help the team with day-to-day work. Be friendly.",
]
KIND_WEIGHTS = {
    "call": 32, "answer": 28, "parallel": 7, "followup": 8, "abstain": 11, "nocall": 0, "chat": 20,
}  # fmt: skip
# which family a drawn tool comes from: lookups (many domains, values of many shapes) are most like
# what agents call; the record actions and the hand-written tools keep their shapes in the mix (round 3
# had 45/35/20); the round-4 pattern tools are about a fifth of the calls, with the conversations'
# uniform draw over all tools
FAMILY_WEIGHTS = {"lookup": 36, "record": 28, "hand": 16, "pattern": 20}
# a tool of a kin (look-alike ids, text to encode) is offered with others of its kin this often
KIN_SHARE = 0.7
# refusals taught that a missing tool means "I can't": the tuned model then refused held-out tools it
# had never seen (adapter of 2026-12-06, 10 of 42 calls); plain answers teach "no call" without that
REFUSE_SHARE = 0.0  # of the multi-turn episodes
NOCALL = [
    "Sorry, I don't have a tool that can do that.",
    "I can't do that with the tools I have available.",
]


def compact(args: dict[str, Any]) -> str:
    """Arguments the way the grammar lays them out (llguidance's compact JSON)."""
    return json.dumps(args, ensure_ascii=False, separators=(",", ":"))


def joined(first: str, joiner: str, second: str, args: dict[str, Any]) -> str:
    """Two requests in one message, the second's first letter lowercased unless a value begins it
    ("Also, what's..." but "Also, Saturday works better...": a value is copied as written)."""
    if not any(isinstance(v, str) and v and second.startswith(v) for v in args.values()):
        second = second[0].lower() + second[1:]
    return first + joiner + second


def check_disjoint(tools: list[Tool]) -> None:
    """Refuse training tools that share a name or a domain with the held-out evaluation's."""
    held = heldout_tools()
    names = {t.name for t in tools} & {t.name for t in held}
    domains = {t.domain for t in tools} & {t.domain for t in held}
    if names or domains:
        raise ValueError(f"training tools overlap the held-out set: {sorted(names | domains)}")


class Generator:
    def __init__(self, seed: int, tools: list[Tool] | None = None) -> None:
        self.rng = random.Random(seed)
        if tools is None:
            families = {
                "hand": hand_tools(),
                "record": record_tools(random.Random(seed)),
                "lookup": lookup_tools(random.Random(seed + 1)),
                "pattern": pattern_tools(random.Random(seed + 2)),
            }
        else:
            families = {"hand": tools}
        self.families = families
        self.tools = [t for ts in families.values() for t in ts]
        check_disjoint(self.tools)
        self.calls = 0
        # turns no tool fits: the hand-written pairs and the base model's own answers (train/distill.py)
        self.chat_qa = PLAIN_QA + distilled_answers()

    def _call(self, tool: Tool, args: dict[str, Any], history: bool = False) -> dict[str, Any]:
        """A call; in the history of a single example its arguments are sometimes spaced JSON, as
        clients send them back (LangChain, n8n and the evaluation re-serialize with json.dumps)."""
        self.calls += 1
        cid = f"call_{self.rng.getrandbits(48):012x}"
        spaced = history and self.rng.random() < 0.5
        text = json.dumps(args, ensure_ascii=False) if spaced else compact(args)
        return {"id": cid, "type": "function", "function": {"name": tool.name, "arguments": text}}

    def _pick(self) -> Tool:
        family = self.rng.choices(list(FAMILY_WEIGHTS), list(FAMILY_WEIGHTS.values()))[0]
        return self.rng.choice(self.families.get(family) or self.tools)

    def _content(self, result: dict[str, Any]) -> str:
        """A tool message: the result as JSON, or a lone value as plain text (n8n's Calculator)."""
        if len(result) == 1 and self.rng.random() < 0.3:
            (value,) = result.values()
            if not isinstance(value, dict | list | bool):
                return str(value)
        return json.dumps(result, ensure_ascii=False)

    def _toolset(self, must: list[Tool], k: int | None = None) -> list[Tool]:
        """The tools offered: `must` and others; with a tool of a kin, mostly others of its kin."""
        k = k or self.rng.choice([1, 2, 2, 3])
        names = {t.name for t in must}
        pool = [t for t in self.tools if t.name not in names]
        kin = {t.kin for t in must if t.kin}
        if kin and self.rng.random() < KIN_SHARE:
            pool = [t for t in pool if t.kin in kin]
            k = max(k, len(must) + 1)
        chosen = must + self.rng.sample(pool, max(0, k - len(must)))
        self.rng.shuffle(chosen)
        return chosen

    def _head(self) -> list[ChatMessage]:
        system = self.rng.choice(SYSTEMS)
        return [ChatMessage("system", system)] if system else []

    def example(self, kind: str) -> tuple[list[ChatMessage], list[Tool], str]:
        """(messages before the target turn, the tools offered, the target assistant text)."""
        rng = self.rng
        msgs = self._head()
        tool = self._pick()
        if kind in ("call", "answer"):
            text, args = tool.request(rng)
            msgs.append(ChatMessage("user", text))
            tools = self._toolset([tool])
            call = self._call(tool, args, history=kind == "answer")
            if kind == "call":
                return msgs, tools, _calls_text(GENERIC, [call])
            result = tool.result(args, rng)
            msgs.append(ChatMessage("assistant", "", tool_calls=[call]))
            msgs.append(ChatMessage("tool", self._content(result), tool_call_id=call["id"]))
            return msgs, tools, tool.answer(rng, args, result)
        if kind == "parallel":
            other = tool if rng.random() < 0.5 else self._pick()
            t1, a1 = tool.request(rng, optional_p=0.0)
            t2, a2 = other.request(rng, optional_p=0.0)
            joiner = rng.choice([" Also, ", " And ", " Then "])
            msgs.append(ChatMessage("user", joined(t1, joiner, t2, a2)))
            tools = self._toolset(list({t.name: t for t in (tool, other)}.values()))
            return msgs, tools, _calls_text(GENERIC, [self._call(tool, a1), self._call(other, a2)])
        if kind == "followup":
            text, args = tool.request(rng)
            call = self._call(tool, args, history=True)
            result = tool.result(args, rng)
            nxt = self._pick()
            t2, a2 = nxt.request(rng)
            msgs += [
                ChatMessage("user", text),
                ChatMessage("assistant", "", tool_calls=[call]),
                ChatMessage("tool", self._content(result), tool_call_id=call["id"]),
                ChatMessage("assistant", tool.answer(rng, args, result)),
                ChatMessage("user", t2),
            ]
            tools = self._toolset(list({t.name: t for t in (tool, nxt)}.values()), k=rng.choice([2, 3]))
            return msgs, tools, _calls_text(GENERIC, [self._call(nxt, a2)])
        if kind in ("abstain", "chat"):
            question, answer = rng.choice(self.chat_qa)
            msgs.append(ChatMessage("user", question))
            return msgs, ([] if kind == "chat" else self._toolset([])), answer
        if kind == "nocall":
            text, _ = tool.request(rng)
            msgs.append(ChatMessage("user", text))
            pool = [t for t in self.tools if t.domain != tool.domain]
            return msgs, rng.sample(pool, rng.choice([1, 2, 3])), rng.choice(NOCALL)
        raise ValueError(kind)

    def episode(self, tools: list[Tool]) -> list[ChatMessage]:
        """One exchange in a longer conversation over a fixed tool set, ending in an assistant turn:
        a call, its result and the answer; two calls; a plain question; a request no tool fits."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.55:
            tool = rng.choice(tools)
            text, args = tool.request(rng)
            call = self._call(tool, args)
            result = tool.result(args, rng)
            return [
                ChatMessage("user", text),
                ChatMessage("assistant", "", tool_calls=[call]),
                ChatMessage("tool", self._content(result), tool_call_id=call["id"]),
                ChatMessage("assistant", tool.answer(rng, args, result)),
            ]
        if roll < 0.65:
            t1, t2 = rng.choice(tools), rng.choice(tools)
            x1, a1 = t1.request(rng, optional_p=0.0)
            x2, a2 = t2.request(rng, optional_p=0.0)
            c1, c2 = self._call(t1, a1), self._call(t2, a2)
            r1, r2 = t1.result(a1, rng), t2.result(a2, rng)
            return [
                ChatMessage("user", joined(x1, rng.choice([" Also, ", " And "]), x2, a2)),
                ChatMessage("assistant", "", tool_calls=[c1, c2]),
                ChatMessage("tool", json.dumps(r1, ensure_ascii=False), tool_call_id=c1["id"]),
                ChatMessage("tool", json.dumps(r2, ensure_ascii=False), tool_call_id=c2["id"]),
                ChatMessage("assistant", t1.answer(rng, a1, r1) + " " + t2.answer(rng, a2, r2)),
            ]
        if roll < 1.0 - REFUSE_SHARE:
            question, answer = rng.choice(self.chat_qa)
            return [ChatMessage("user", question), ChatMessage("assistant", answer)]
        domains = {t.domain for t in tools}
        other = rng.choice([t for t in self.tools if t.domain not in domains])
        return [ChatMessage("user", other.request(rng)[0]), ChatMessage("assistant", rng.choice(NOCALL))]

    def conversation(self, renderer: PromptRenderer) -> list[tuple[str, bool]]:
        """A multi-turn conversation as (text, is_target) segments: every assistant turn is a target,
        so the long tools prompt is paid once for several targets."""
        msgs = self._head()
        tools = self._toolset([], k=self.rng.choice([2, 3]))
        for _ in range(self.rng.choice([2, 3, 4])):
            msgs += self.episode(tools)
        openai = [t.openai(self.rng) for t in tools]
        segments: list[tuple[str, bool]] = []
        done = ""
        for i, m in enumerate(msgs):
            if m.role != "assistant":
                continue
            prompt = renderer.render(msgs[:i], openai)
            if not prompt.startswith(done):
                raise ValueError("the template does not render turns append-only")
            target = _calls_text(GENERIC, m.tool_calls) if m.tool_calls else m.content
            segments += [(prompt[len(done) :], False), (target + END, True)]
            done = prompt + target + END
        return segments

    def samples(
        self, renderer: PromptRenderer, n: int, conversations: float = 0.7
    ) -> Iterator[dict[str, Any]]:
        """n rows {kind, segments}: multi-turn conversations (share `conversations`) and single
        examples of every kind."""
        kinds = list(KIND_WEIGHTS)
        weights = list(KIND_WEIGHTS.values())
        for _ in range(n):
            if self.rng.random() < conversations:
                yield {"kind": "conversation", "segments": self.conversation(renderer)}
                continue
            kind = self.rng.choices(kinds, weights)[0]
            msgs, tools, target = self.example(kind)
            openai = [t.openai(self.rng) for t in tools]
            prompt = renderer.render(msgs, openai or None)
            yield {"kind": kind, "segments": [(prompt, False), (target + END, True)]}


def renderer_for(model_dir: str) -> PromptRenderer:
    from transformers import AutoTokenizer

    return PromptRenderer(AutoTokenizer.from_pretrained(model_dir))


def base_model_dir() -> str:
    """The converted float folder of the embedded SmolLM2 GGUF (built on first use)."""
    from models.gguf import converted_dir, embedded_gguf

    path = embedded_gguf()
    if path is None:
        raise SystemExit("the embedded model is not installed (make install)")
    return str(converted_dir(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--model", default=None, help="checkpoint folder whose template renders (default: embedded)"
    )
    ap.add_argument("--out", default="train/out/data.jsonl")
    args = ap.parse_args()
    renderer = renderer_for(args.model or base_model_dir())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for row in Generator(args.seed).samples(renderer, args.n):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {args.n} examples to {out}")


if __name__ == "__main__":
    main()
