"""engine.LLM end to end on the tiny Qwen3 checkpoint (CPU, float32): sampling parameters, stopping,
logprobs, prompt forms, and clear errors for bad requests, configs and checkpoints."""

from __future__ import annotations

import json
import shutil

import pytest

from engine import LLM, EngineConfig, SamplingParams

EOS = 151645  # <|im_end|>
HELLO = 9707  # "Hello"
PROMPTS = ["Hello world", "你好，世界", "The quick brown fox"]


@pytest.fixture(scope="module")
def llm(tiny_qwen3) -> LLM:
    return LLM(tiny_qwen3, device="cpu", dtype="float32", num_kv_blocks=256)


def greedy(**kw) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, "max_tokens": 6, "ignore_eos": True, **kw})


def tokens(llm: LLM, prompts, params) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, params)]


def test_greedy_basics_and_free_blocks(llm):
    outs = llm.generate(PROMPTS, greedy())
    assert [len(o.token_ids) for o in outs] == [6, 6, 6]
    assert all(o.finish_reason == "length" for o in outs)
    for o in outs:
        assert o.text == llm.tokenizer.decode(o.token_ids)
    stats = llm.stats()
    assert stats["free_blocks"] == stats["total_blocks"] and stats["running"] == stats["waiting"] == 0


def test_str_prompt_equals_token_ids_and_order_kept(llm):
    ids = [llm.tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    by_text = tokens(llm, PROMPTS, greedy(max_tokens=3))
    by_ids = tokens(llm, ids, greedy(max_tokens=3))
    assert by_text == by_ids
    assert tokens(llm, PROMPTS[::-1], greedy(max_tokens=3)) == by_text[::-1]
    assert tokens(llm, PROMPTS[0], greedy(max_tokens=3)) == by_text[:1]  # a single str prompt


def test_one_sampling_params_per_prompt(llm):
    outs = llm.generate(PROMPTS[:2], [greedy(max_tokens=2), greedy(max_tokens=4)])
    assert [len(o.token_ids) for o in outs] == [2, 4]
    with pytest.raises(ValueError, match="2 SamplingParams for 3 prompts"):
        llm.generate(PROMPTS, [greedy(), greedy()])


def test_seed_reproducible_and_different_seeds_differ(llm):
    params = lambda seed: SamplingParams(temperature=1.0, seed=seed, max_tokens=8, ignore_eos=True)
    a = tokens(llm, PROMPTS[:1], params(123))
    assert tokens(llm, PROMPTS[:1], params(123)) == a
    assert tokens(llm, PROMPTS[:1], params(7)) != a
    # a seeded request samples the same tokens whatever else runs in its batch
    batch = [PROMPTS[1], PROMPTS[0], PROMPTS[2]]
    mixed = llm.generate(batch, [SamplingParams(temperature=1.0, max_tokens=8), params(123), greedy()])
    assert mixed[1].token_ids == a[0]


def test_n_returns_n_outputs(llm):
    out = llm.generate(
        PROMPTS[:1], SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=5, ignore_eos=True)
    )
    assert [c.index for c in out[0].outputs] == [0, 1]
    assert all(len(c.token_ids) == 5 for c in out[0].outputs)
    assert out[0].outputs[0].token_ids != out[0].outputs[1].token_ids


def test_top_k_1_and_tiny_top_p_equal_greedy(llm):
    two = PROMPTS[:2]
    want = tokens(llm, two, greedy(max_tokens=4))
    assert tokens(llm, two, greedy(temperature=0.9, top_k=1, seed=1, max_tokens=4)) == want
    assert tokens(llm, two, greedy(temperature=0.9, top_p=1e-9, seed=1, max_tokens=4)) == want
    # min_p = 1 keeps only the most likely token (a random model has no exact ties)
    assert tokens(llm, two, greedy(temperature=0.9, min_p=1.0, seed=1, max_tokens=4)) == want


def test_penalties_change_greedy_path(llm):
    plain = tokens(llm, PROMPTS[:2], greedy(max_tokens=8))
    assert any(len(set(t)) < len(t) for t in plain)  # the random model repeats itself
    for kw in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0}, {"repetition_penalty": 5.0}):
        assert tokens(llm, PROMPTS[:2], greedy(max_tokens=8, **kw)) != plain, kw
    # a strong presence penalty removes the repeats of the unpenalized path
    fresh = tokens(llm, PROMPTS[:2], greedy(max_tokens=8, presence_penalty=2.0, repetition_penalty=5.0))
    assert sum(len(t) - len(set(t)) for t in fresh) < sum(len(t) - len(set(t)) for t in plain)


def test_logit_bias_forces_a_token(llm):
    out = tokens(llm, PROMPTS[:1], greedy(max_tokens=3, logit_bias={HELLO: 100.0}))
    assert out == [[HELLO] * 3]
    sampled = tokens(llm, PROMPTS[:1], greedy(temperature=1.0, max_tokens=3, logit_bias={HELLO: 100.0}))
    assert sampled == [[HELLO] * 3]


def test_logits_processor_hook(llm):
    def only_hello(output_ids, logits):
        logits[:] = -float("inf")
        logits[HELLO] = 0.0
        return logits

    assert tokens(llm, PROMPTS[:1], greedy(max_tokens=2, logits_processors=[only_hello])) == [[HELLO] * 2]


def test_stop_token_ids_stop_with_the_id_included(llm):
    out = llm.generate(PROMPTS[:1], greedy(logit_bias={HELLO: 100.0}, stop_token_ids=[HELLO]))[0]
    assert out.token_ids == [HELLO] and out.finish_reason == "stop"
    assert out.outputs[0].stop_reason == HELLO and out.text == ""


def test_eos_stops_unless_ignore_eos(llm):
    bias = {EOS: 100.0}
    out = llm.generate(PROMPTS[:1], greedy(ignore_eos=False, logit_bias=bias))[0]
    assert out.token_ids == [EOS] and out.finish_reason == "stop" and out.text == ""
    out = llm.generate(PROMPTS[:1], greedy(ignore_eos=True, max_tokens=3, logit_bias=bias))[0]
    assert out.token_ids == [EOS] * 3 and out.finish_reason == "length"


def test_max_tokens_gives_length(llm):
    out = llm.generate(PROMPTS[:1], greedy(max_tokens=4, ignore_eos=False))[0]
    assert len(out.token_ids) == 4 and out.finish_reason == "length"


def test_min_tokens_suppresses_eos(llm):
    out = llm.generate(PROMPTS[:1], greedy(ignore_eos=False, min_tokens=2, logit_bias={EOS: 100.0}))[0]
    assert len(out.token_ids) == 3 and EOS not in out.token_ids[:2]
    assert out.token_ids[2] == EOS and out.finish_reason == "stop"


def test_stop_string_cuts_text(llm):
    plain = llm.generate(PROMPTS[:1], greedy(max_tokens=8))[0]
    text = plain.text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert len(stop) == 3 and stop.strip()
    out = llm.generate(PROMPTS[:1], greedy(max_tokens=8, stop=[stop]))[0]
    assert out.finish_reason == "stop" and out.outputs[0].stop_reason == stop
    assert out.text == text[: text.find(stop)]
    assert out.token_ids == plain.token_ids[: len(out.token_ids)]
    out = llm.generate(PROMPTS[:1], greedy(max_tokens=8, stop=[stop], include_stop_str_in_output=True))[0]
    assert out.text == text[: text.find(stop) + len(stop)]


def test_logprobs_chosen_and_sorted_top(llm):
    out = llm.generate(PROMPTS[:1], greedy(max_tokens=4, logprobs=3))[0]
    lps = out.outputs[0].logprobs
    assert [lp.token_id for lp in lps] == out.token_ids
    for lp in lps:
        values = [v for _, v in lp.top]
        assert len(lp.top) == 3 and values == sorted(values, reverse=True)
        assert lp.top[0][0] == lp.token_id and lp.logprob == pytest.approx(values[0])  # greedy: the best
        assert lp.logprob <= 0.0
    out = llm.generate(PROMPTS[:1], SamplingParams(temperature=1.0, seed=0, max_tokens=4, logprobs=0))[0]
    assert all(lp.top == [] and lp.logprob <= 0.0 for lp in out.outputs[0].logprobs)
    assert llm.generate(PROMPTS[:1], greedy(max_tokens=2))[0].outputs[0].logprobs is None


def test_prompt_too_long_names_the_context_length(llm):
    with pytest.raises(ValueError, match="context length 4096"):
        llm.generate([[1] * 4095], greedy(max_tokens=8))


@pytest.mark.parametrize("bad", [-1, 151936, 10**9])
def test_token_id_outside_vocabulary(llm, bad):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[1, 2, bad]], greedy())


@pytest.mark.parametrize(
    "params",
    [
        {"logit_bias": {151936: 1.0}},
        {"logit_bias": {-1: 1.0}},
        {"stop_token_ids": [151936]},
    ],
)
def test_sampling_token_ids_outside_vocabulary(llm, params):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate(PROMPTS[:1], greedy(**params))
    assert llm.generate(PROMPTS[:1], greedy(max_tokens=2))[0].finish_reason == "length"  # still healthy


def test_empty_prompt_is_an_error(llm):
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]], greedy())


def test_prefix_cache_hits_are_reported(llm):
    prompt = list(range(1000, 1040))  # 2 full blocks and a tail
    first = llm.generate([prompt], greedy(max_tokens=2))[0]
    again = llm.generate([prompt + [5]], greedy(max_tokens=2))[0]
    assert first.cached_tokens == 0 or first.cached_tokens % 16 == 0
    assert again.cached_tokens == 32
    llm.reset_prefix_cache()
    assert llm.generate([prompt + [6]], greedy(max_tokens=2))[0].cached_tokens == 0


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"block_size": 0}, "block_size"),
        ({"block_size": 24}, "block_size"),
        ({"dtype": "float64"}, "dtype"),
        ({"device": "tpu"}, "device"),
        ({"load_format": "pt"}, "load_format"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_batched_tokens": -5}, "max_num_batched_tokens"),
        ({"num_kv_blocks": 0}, "num_kv_blocks"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ],
)
def test_engine_config_validation_names_the_field(tiny_qwen3, kwargs, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(model=str(tiny_qwen3), **kwargs)
    with pytest.raises(ValueError, match=field):
        LLM(tiny_qwen3, **kwargs)


def test_missing_model_folder(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        LLM(tmp_path / "nope", device="cpu")


def test_unsupported_architecture_is_named(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 100})
    )
    with pytest.raises(ValueError, match="unsupported architecture GPT2LMHeadModel"):
        LLM(tmp_path, device="cpu", dtype="float32")


def test_checkpoint_missing_a_weight(tiny_qwen3, tmp_path):
    from safetensors.torch import load_file, save_file

    for f in tiny_qwen3.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, tmp_path / f.name)
    weights = load_file(str(tiny_qwen3 / "model.safetensors"))
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lacks weights for: layers\.1\.mlp\.down_proj\.weight"):
        LLM(tmp_path, device="cpu", dtype="float32", num_kv_blocks=8)


def test_a_failing_sequence_ends_alone_and_leaves_the_engine_usable(llm):
    def boom(output_ids, logits):
        raise RuntimeError("processor failed")

    alone = llm.generate([PROMPTS[0], PROMPTS[2]], greedy())
    out = llm.generate(PROMPTS, [greedy(), greedy(logits_processors=[boom]), greedy()])
    assert [o.finish_reason for o in out] == ["length", "error", "length"]
    assert out[1].token_ids == []
    assert [out[0].token_ids, out[2].token_ids] == [a.token_ids for a in alone]
    stats = llm.stats()
    assert stats["free_blocks"] == stats["total_blocks"] and stats["running"] == stats["waiting"] == 0
    assert llm.generate(PROMPTS[:1], greedy(max_tokens=2))[0].finish_reason == "length"


def test_block_size_defaults_by_device(tiny_qwen3):
    assert EngineConfig().resolve_block_size("cuda") == 32 and EngineConfig().resolve_block_size("cpu") == 16
    assert EngineConfig(block_size=64).resolve_block_size("cuda") == 64
    llm = LLM(tiny_qwen3, device="cpu", dtype="float32", num_kv_blocks=64)
    assert llm.config.block_size == 16 and llm.core.block_manager.block_size == 16
    assert llm.core.runner.kv_caches[0][0].shape[1] == 16
