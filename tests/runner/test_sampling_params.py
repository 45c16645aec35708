"""SamplingParams refuses every out-of-range or wrongly typed numeric field with a ValueError that
names it (the app answers those with a 400); the vocabulary bounds are checked at add time."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams

INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 0},
        {"n": 1.5},
        {"n": True},
        {"temperature": -0.1},
        {"temperature": INF},
        {"temperature": NAN},
        {"temperature": "0.5"},
        {"top_p": 0.0},
        {"top_p": 1.01},
        {"top_p": NAN},
        {"top_k": 0},
        {"top_k": -2},
        {"top_k": 9223372036854775808},
        {"top_k": 2.0},
        {"min_p": -0.01},
        {"min_p": 1.5},
        {"min_p": NAN},
        {"repetition_penalty": 0.0},
        {"repetition_penalty": INF},
        {"frequency_penalty": 2.5},
        {"frequency_penalty": -INF},
        {"presence_penalty": NAN},
        {"max_tokens": 0},
        {"max_tokens": "4"},
        {"min_tokens": -1},
        {"logprobs": -1},
        {"logprobs": 21},
        {"seed": 1 << 63},
        {"seed": -(1 << 63) - 1},
        {"seed": 1.5},
        {"logit_bias": {5: INF}},
        {"logit_bias": {5: 101.0}},
        {"logit_bias": {5: NAN}},
        {"logit_bias": {"5": 1.0}},
        {"stop_token_ids": [1 << 64]},
        {"stop": [1]},
    ],
)
def test_out_of_range_fields_name_the_field(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_bounds_themselves_are_accepted():
    p = SamplingParams(
        n=3,
        temperature=0.0,
        top_p=1.0,
        top_k=-1,
        min_p=1.0,
        repetition_penalty=0.01,
        frequency_penalty=-2.0,
        presence_penalty=2,
        logprobs=20,
        seed=(1 << 63) - 1,
        logit_bias={0: -100.0, 1: 100},
    )
    assert p.greedy and p.top_k == -1


def test_top_k_beyond_the_vocabulary_is_refused_at_add_time(tiny_qwen3):
    llm = LLM(tiny_qwen3, device="cpu", dtype="float32", num_kv_blocks=16)
    vocab = llm.core.vocab_size
    with pytest.raises(ValueError, match="top_k"):
        llm.core.add_request("big-k", [1, 2, 3], SamplingParams(top_k=vocab + 1))
    assert not llm.core.requests and not llm.core.has_unfinished()
    out = llm.generate([[1, 2, 3]], SamplingParams(top_k=vocab, max_tokens=2, ignore_eos=True))
    assert out[0].finish_reason == "length" and len(out[0].token_ids) == 2
