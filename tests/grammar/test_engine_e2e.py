"""End to end through engine.LLM on the tiny random checkpoint: SamplingParams(constraint=...) from
build_constraint; outputs parse and validate, finish with "stop" within max_tokens; G1 bench smoke."""

from __future__ import annotations

import json

import jsonschema
import pytest

from bench.grammar import g1_tools, run_g1
from grammar.api import build_constraint
from tests.grammar.driver import split_output


@pytest.fixture(scope="module")
def llm(tiny_qwen3):
    from engine.llm import LLM

    return LLM(str(tiny_qwen3), device="cpu", dtype="float32")


def test_required_calls_through_the_engine(llm):
    from runner.sampling_params import SamplingParams

    tools = g1_tools()
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    vocab_size = llm.core.vocab_size
    prompts = [[(7 * i + j) % 5000 for j in range(24)] for i in range(6)]
    for max_tokens in (None, 40, 96):
        f = build_constraint(
            llm.tokenizer,
            tools=tools,
            tool_choice="required",
            max_tokens=max_tokens or 512,
            vocab_size=vocab_size,
        )
        limit = max_tokens or f.min_tokens  # the tightest budget too
        params = SamplingParams(temperature=1.0, max_tokens=limit, constraint=f, seed=3)
        for out in llm.generate(prompts, params):
            o = out.outputs[0]
            assert o.finish_reason == "stop" and len(o.token_ids) <= limit
            _, calls = split_output(llm.tokenizer.decode(o.token_ids, skip_special_tokens=False))
            assert calls
            for call in calls:
                jsonschema.validate(call["arguments"], schemas[call["name"]])


def test_json_schema_through_the_engine(llm):
    from runner.sampling_params import SamplingParams

    schema = {
        "type": "object",
        "properties": {
            "state": {"type": "string", "maxLength": 8},
            "n": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["state", "n"],
        "additionalProperties": False,
    }
    rf = {"type": "json_schema", "json_schema": {"schema": schema}}
    f = build_constraint(llm.tokenizer, response_format=rf, max_tokens=48, vocab_size=llm.core.vocab_size)
    outs = llm.generate([[1, 2, 3, 4]] * 3, SamplingParams(temperature=1.0, max_tokens=48, constraint=f))
    for out in outs:
        jsonschema.validate(json.loads(out.outputs[0].text), schema)


@pytest.mark.heavy  # a bench smoke (~17 s): `make test-all`
def test_g1_bench_smoke(llm):
    lines: list[str] = []
    r = run_g1(llm, n_requests=4, prompt_len=16, max_tokens=128, repeats=2, out=lines.append)
    assert r["valid"] == 4 and r["complete"] == 4
    assert len(r["ratios"]) == 2 and r["ratio"] in r["ratios"]
    assert len(r["pair_tokens"]) == 2 and r["output_tokens"] in r["pair_tokens"]
    assert any(f"({r['pair_tokens'][0]} tokens)" in line for line in lines)
    assert r["mask_us_per_token"] > 0 and r["compile_ms"] > 0
    assert any("ratio" in line for line in lines)


def test_overlapped_steps_equal_synchronous(tiny_qwen3):
    # the overlapped engine fills the masks while the next forward runs: same tokens, all valid
    from engine.llm import LLM
    from runner.sampling_params import SamplingParams

    tools = g1_tools()
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    kw = dict(device="cpu", dtype="float32", num_kv_blocks=128, block_size=16)
    sync = LLM(str(tiny_qwen3), async_scheduling=False, **kw)
    overlap = LLM(str(tiny_qwen3), async_scheduling=True, **kw)
    prompts = [[(11 * i + j) % 5000 for j in range(20 + i)] for i in range(6)]
    f = build_constraint(
        sync.tokenizer, tools=tools, tool_choice="required", max_tokens=80, vocab_size=sync.core.vocab_size
    )
    # greedy, and seeded sampling with lengths from the shortest call up (requests end mid-batch)
    for params in (
        [SamplingParams(temperature=0, max_tokens=f.min_tokens + 4 * i, constraint=f) for i in range(6)],
        [SamplingParams(temperature=1.0, seed=i, max_tokens=80, constraint=f) for i in range(6)],
    ):
        a, b = sync.generate(prompts, params), overlap.generate(prompts, params)
        for x, y in zip(a, b, strict=True):
            ox, oy = x.outputs[0], y.outputs[0]
            assert ox.token_ids == oy.token_ids and ox.finish_reason == oy.finish_reason == "stop"
            _, calls = split_output(sync.tokenizer.decode(oy.token_ids, skip_special_tokens=False))
            assert calls
            for call in calls:
                jsonschema.validate(call["arguments"], schemas[call["name"]])
