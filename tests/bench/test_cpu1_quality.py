"""bench.cpu1's quality metrics on a tiny checkpoint: the divergence count, the teacher-forced top-1
agreement (each position fed the reference's tokens before it) and HF transformers' floor."""

from __future__ import annotations

import pytest

from bench import cpu1
from engine import LLM, SamplingParams
from models.tiny import build_checkpoint

NEW = 6


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    shape = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, max_position_embeddings=512, rms_norm_eps=1e-6,
                 tie_word_embeddings=True, initializer_range=0.1)  # fmt: skip
    return build_checkpoint(tmp_path_factory.mktemp("cpu1"), "llama", vocab_size=512, shape=shape)


@pytest.fixture(scope="module")
def run(tiny):
    prompts = [[(11 * i + 5 * j) % 500 + 1 for j in range(9 + i)] for i in range(4)]
    llm = LLM(str(tiny), device="cpu", dtype="float32", num_kv_blocks=64)
    params = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    return llm, prompts, want


def test_divergence_counts_tokens_before_the_first_difference():
    assert cpu1._divergence([[1, 2, 3], [4, 5, 6]], [[1, 9, 3], [4, 5, 6]]) == (1 + 3, 1)


def test_teacher_forced_agreement_is_full_against_itself(run):
    llm, prompts, want = run
    assert cpu1.teacher_forced(llm, prompts, want) == len(prompts) * NEW


def test_teacher_forced_counts_each_position_on_its_own(run):
    llm, prompts, want = run
    # a wrong reference token at position 2 costs that position; the others are scored from the
    # (now different) prefix, with no divergence carried over
    bad = [w[:2] + [(w[2] + 1) % 500] + w[3:] for w in want]
    got = cpu1.teacher_forced(llm, prompts, bad)
    assert got <= len(prompts) * (NEW - 1) and got >= 2 * len(prompts)


def test_hf_floor_agrees_with_the_engine_on_the_same_weights(tiny, run):
    _, prompts, want = run
    floor = cpu1.hf_floor(str(tiny), prompts, want)
    total = len(prompts) * NEW
    assert floor["teacher_forced_tokens"] >= 0.9 * total
    assert 0 <= floor["prefix_tokens"] <= total and 0 <= floor["equal_continuations"] <= len(prompts)
