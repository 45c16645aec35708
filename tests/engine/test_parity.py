"""Greedy tokens of our engine equal HF transformers' generate, token for token (float32, CPU),
on tiny random checkpoints of every supported architecture, under every scheduling regime.
A divergence is accepted only where HF's two best logits differ by < 1e-4 (counted)."""

from __future__ import annotations

import random

import pytest
import torch

from engine import LLM, SamplingParams

MAX_NEW = 24
TIE = 1e-4

ARCHS = {
    "qwen3": {},
    "qwen2": {},  # q/k/v bias
    "llama": {  # Llama 3 rope scaling, untied embeddings, sharded safetensors
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
        "tie_word_embeddings": False,
        "max_shard_size": "8MB",
    },
    "mistral": {"sliding_window": 64},  # sliding window shorter than most prompts
}


def make_prompts(seed: int, n: int = 32) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 2, 15, 16, 17, 31, 32, 33, 299, 300] + [rng.randint(1, 300) for _ in range(n - 10)]
    return [[rng.randint(0, 10000) for _ in range(length)] for length in lengths[:n]]


def shared_prefix_prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randint(0, 10000) for _ in range(100)]
    return [prefix + [rng.randint(0, 10000) for _ in range(rng.randint(1, 60))] for _ in range(8)]


class HFReference:
    """HF greedy continuations and per-step logits, computed once per (checkpoint, prompt)."""

    def __init__(self, path) -> None:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(2)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.cache: dict[tuple[int, ...], tuple[list[int], torch.Tensor]] = {}

    def run(self, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
        key = tuple(prompt)
        if key not in self.cache:
            with torch.no_grad():
                out = self.model.generate(
                    torch.tensor([prompt]),
                    max_new_tokens=MAX_NEW,
                    min_new_tokens=MAX_NEW,
                    do_sample=False,
                    output_scores=True,
                    return_dict_in_generate=True,
                    pad_token_id=0,
                )
            tokens = out.sequences[0, len(prompt) :].tolist()
            self.cache[key] = (tokens, torch.stack([s[0] for s in out.scores]))
        return self.cache[key]


def assert_parity(hf: HFReference, prompts, outputs) -> int:
    """Asserts equality up to near-ties; returns how many prompts diverged at a near-tie."""
    ties = 0
    for prompt, out in zip(prompts, outputs, strict=True):
        want, scores = hf.run(prompt)
        got = out.token_ids
        assert len(got) == MAX_NEW and out.finish_reason == "length"
        for step, (a, b) in enumerate(zip(got, want, strict=True)):
            if a != b:
                top2 = scores[step].topk(2).values
                gap = float(top2[0] - top2[1])
                assert gap < TIE, f"diverged at step {step} (prompt len {len(prompt)}) with HF gap {gap:.2e}"
                ties += 1
                break
    return ties


@pytest.fixture(scope="module", params=list(ARCHS))
def arch_case(request, checkpoint_factory):
    overrides = dict(ARCHS[request.param])
    path = checkpoint_factory(request.param, **overrides)
    return request.param, path, HFReference(path)


GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)

REGIMES = {
    "default": dict(),
    "block32": dict(block_size=32),
    "chunked": dict(max_num_batched_tokens=48),  # prompts of up to 300 tokens go in chunks
    "preempt": dict(num_kv_blocks=48, block_size=16),  # 768 token slots for 32 requests
}


@pytest.mark.parametrize("regime", list(REGIMES))
def test_greedy_parity(arch_case, regime):
    arch, path, hf = arch_case
    kwargs = {"device": "cpu", "dtype": "float32", "num_kv_blocks": 2048, **REGIMES[regime]}
    llm = LLM(path, **kwargs)
    prompts = make_prompts(seed=1)
    outs = llm.generate(prompts, GREEDY)
    ties = assert_parity(hf, prompts, outs)
    stats = llm.stats()
    assert stats["free_blocks"] == stats["total_blocks"]
    if regime == "preempt":
        assert stats["num_preemptions"] > 0
    print(f"{arch}/{regime}: {len(prompts)} prompts, near-tie divergences: {ties}")


@pytest.mark.parametrize("block_size", [16, 32])
def test_prefix_cache_parity(arch_case, block_size):
    arch, path, hf = arch_case
    llm = LLM(path, device="cpu", dtype="float32", num_kv_blocks=1024, block_size=block_size)
    prompts = shared_prefix_prompts(seed=2)
    first = llm.generate(prompts[:1], GREEDY)  # fills the cache with the shared prefix
    hits_before = llm.stats()["prefix_cache_hit_tokens"]
    rest = llm.generate(prompts[1:], GREEDY)
    assert llm.stats()["prefix_cache_hit_tokens"] - hits_before >= 7 * (100 // block_size) * block_size
    assert all(o.outputs[0] and o.cached_tokens > 0 for o in rest)
    ties = assert_parity(hf, prompts, first + rest)
    # the same prompts again: now whole prompts (all but the last partial block) come from the cache
    again = llm.generate(prompts, GREEDY)
    ties += assert_parity(hf, prompts, again)
    print(f"{arch}/prefix bs={block_size}: near-tie divergences: {ties}")


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("epilogue", [False, True])
def test_folded_norms_parity(checkpoint_factory, arch, epilogue, monkeypatch):
    """RMSNorm weights folded into the projections after them (LlamaForCausalLM.fold_norms, what 16-bit
    models on CUDA get): decode steps of 5 rows or more skip the norms (dispatch.folded_decode_layer_tail,
    the residual adds in the projections, each row's 1 / rms applied by the SiLU and the attention), on
    weights whose norms are not ones; greedy tokens equal HF's up to near-ties. With `epilogue`, those
    steps' layers after the first project the residual with the new token's work in the projection
    (dispatch.qkv_new_token, which CUDA takes from QKV_EPILOGUE_MIN_M rows; here its reference)."""
    from kernels import dispatch, dispatch_linear, onednn

    path = checkpoint_factory(arch, norm_spread=0.3)
    hf = HFReference(path)
    # folding is a 16-bit CUDA path: dense float weights here, not oneDNN's packed CPU form
    monkeypatch.setattr(onednn, "_available", lambda: False)
    llm = LLM(path, device="cpu", dtype="float32", num_kv_blocks=2048)
    model = llm.core.runner.model
    layer = model.layers[1]
    before = layer.mlp.gate_up_proj.weight.clone(), layer.post_attention_layernorm.weight.clone()
    model.fold_norms()
    assert torch.equal(layer.post_attention_layernorm.weight, torch.ones_like(before[1]))
    assert torch.allclose(layer.mlp.gate_up_proj.weight, before[0] * before[1][None, :])
    with pytest.raises(RuntimeError, match="already folded"):
        model.fold_norms()
    calls, projected = [], []
    folded, qkv_new_token = dispatch.folded_decode_layer_tail, dispatch.qkv_new_token

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])
        return folded(*args, **kwargs)

    monkeypatch.setattr(dispatch, "folded_decode_layer_tail", counted)
    if epilogue:
        monkeypatch.setattr(dispatch, "qkv_epilogue_fits", lambda x, w, d: True)
        monkeypatch.setattr(dispatch, "qkv_new_token", lambda *a: projected.append(1) or qkv_new_token(*a))
    prompts = make_prompts(seed=3, n=12)
    ties = assert_parity(hf, prompts, llm.generate(prompts, GREEDY))
    assert calls and min(calls) >= dispatch_linear.FOLD_MIN_M  # the wide decode steps took the folded tails
    assert len(projected) == (len(calls) if epilogue else 0)  # each folded tail's next layer projected
    print(f"{arch}/folded norms: {len(calls)} folded tails, near-tie divergences: {ties}")
