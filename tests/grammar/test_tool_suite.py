"""≥ 1,000 requests over random n8n-style tool sets (1-8 tools) in every tool_choice mode, random
logits over the real 150k vocabulary, max_tokens 64-256, default backend: every call parses and
validates against its tool's schema; none never calls, required always does, named calls that tool,
parallel_tool_calls=false never makes two."""

from __future__ import annotations

import random
from collections import Counter

import jsonschema
import pytest

from grammar.api import build_constraint
from tests.grammar.conftest import MODEL_VOCAB
from tests.grammar.driver import OPEN_ID, RandomLogits, decode, split_output
from tests.grammar.schemas import tool_set

N_TOOL_SETS = 30
REQUESTS_PER_SET = 34  # 1,020 requests


def _plan(rng: random.Random, tools: list[dict]) -> list[tuple]:
    # (tool_choice, parallel, open_bias) per request: every mode, auto with and without the bias
    names = [t["function"]["name"] for t in tools]
    plan = []
    for i in range(REQUESTS_PER_SET):
        kind = i % 6
        parallel = rng.random() < 0.5
        if kind == 0:
            plan.append(("none", parallel, 0.0))
        elif kind == 1:
            plan.append(("auto", parallel, 0.0))
        elif kind == 2:
            plan.append(("auto", parallel, rng.choice([6.0, 9.0, 12.0])))
        elif kind == 3:
            plan.append(("required", parallel, 0.0))
        elif kind == 4:
            plan.append(({"type": "function", "function": {"name": rng.choice(names)}}, parallel, 0.0))
        else:
            plan.append((rng.choice(["required", "auto"]), False, 9.0))
    return plan


# 80 s on the 2-core CI machine: `make test-all` (tests/app/test_families_tools.py sends 200 in CI)
@pytest.mark.heavy
@pytest.mark.timeout(600)
def test_thousand_requests_all_valid(tok, vocab):
    rng = random.Random(1234)
    logits = RandomLogits(MODEL_VOCAB, seed=7)
    stats: Counter = Counter()
    for _ in range(N_TOOL_SETS):
        tools = tool_set(rng)
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        for choice, parallel, bias in _plan(rng, tools):
            max_tokens = rng.randint(64, 256)
            factory = build_constraint(
                tok,
                tools=tools,
                tool_choice=choice,
                parallel_tool_calls=parallel,
                max_tokens=max_tokens,
                vocab_size=MODEL_VOCAB,
            )
            factory.wait()
            ids = decode(factory, vocab, max_tokens, logits, open_bias=bias)
            assert len(ids) <= max_tokens and ids[-1] == vocab.eos_id, "did not finish within max_tokens"
            text = tok.decode(ids, skip_special_tokens=False)
            content, calls = split_output(text)
            for call in calls:
                assert set(call) == {"name", "arguments"}
                jsonschema.validate(call["arguments"], schemas[call["name"]])
            mode = choice if isinstance(choice, str) else "named"
            if mode == "none":
                assert not calls and OPEN_ID not in ids and "<tool_call>" not in text
            if mode in ("required", "named"):
                assert calls and content == ""
            if mode == "named":
                assert {c["name"] for c in calls} == {choice["function"]["name"]} and len(calls) == 1
            if not parallel:
                assert len(calls) <= 1
            if mode == "auto":
                assert "<tool_call>" not in content
            stats["requests"] += 1
            stats[f"{mode}:calls"] += len(calls)
            stats[f"{mode}:requests"] += 1
            stats["calls"] += len(calls)
            stats["tokens"] += len(ids)
    assert stats["requests"] >= 1000
    assert stats["auto:calls"] > 100  # the bias really made auto mode call
    print(dict(stats))
