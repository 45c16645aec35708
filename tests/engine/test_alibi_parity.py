"""The ALiBi family (models.alibi): greedy tokens of our engine equal HF transformers' generate,
token for token (float32, CPU), on tiny random BLOOM and MPT checkpoints, for 24 prompts, at block sizes
16 and 32, with a small token budget that cuts prompts into chunks mid-block, with preemption, and with
a cached prefix (the bias depends on absolute positions: a chunk or a cache hit that lost them would
diverge). A divergence is accepted only at an HF near-tie (tests/engine/test_parity.py's rule)."""

from __future__ import annotations

import pytest
import torch

from engine import LLM
from models.alibi import AlibiForCausalLM, bloom_slopes, mpt_slopes
from tests.alibi_models import build_alibi_checkpoint
from tests.engine.test_parity import GREEDY, HFReference, assert_parity, make_prompts, shared_prefix_prompts

ARCHS = ("bloom", "mpt")

REGIMES = {
    "block16": dict(block_size=16),
    "block32": dict(block_size=32),
    # prompts of up to 300 tokens go in chunks of 40 / 24 tokens, boundaries inside the blocks
    "chunked16": dict(block_size=16, max_num_batched_tokens=40),
    "chunked32": dict(block_size=32, max_num_batched_tokens=24),
    "preempt": dict(num_kv_blocks=48, block_size=16),  # 768 token slots for 24 requests: recompute
}


@pytest.fixture(scope="module", params=ARCHS)
def alibi_case(request, tmp_path_factory):
    path = build_alibi_checkpoint(tmp_path_factory.mktemp(f"ckpt-{request.param}"), request.param)
    return request.param, path, HFReference(path)


def _llm(path, **kwargs) -> LLM:
    return LLM(str(path), **{"device": "cpu", "dtype": "float32", "num_kv_blocks": 2048, **kwargs})


def test_loaded_as_alibi_model(alibi_case):
    arch, path, hf = alibi_case
    model = _llm(path, num_kv_blocks=64).core.runner.model
    assert isinstance(model, AlibiForCausalLM) and model.spec.arch == arch
    slopes = bloom_slopes(6) if arch == "bloom" else mpt_slopes(6)
    assert torch.equal(model.alibi_slopes, slopes)
    if arch == "bloom":  # the checkpoint's per-head (heads, 3, head_dim) rows, reordered to [q; k; v]
        hf_qkv = hf.model.transformer.h[0].self_attention.query_key_value
        want = hf_qkv.bias.view(6, 3, 16).transpose(0, 1).reshape(-1)
        assert torch.equal(model.layers[0].self_attn.qkv.bias, want)


# CI runs chunked16 (chunk edges inside blocks; HF's references computed there); `make test-all` all
@pytest.mark.slow  # 25-240 s each on two loaded cores (HF's references computed in the first)
@pytest.mark.parametrize(
    "regime", [r if r == "chunked16" else pytest.param(r, marks=pytest.mark.heavy) for r in REGIMES]
)
def test_greedy_parity(alibi_case, regime):
    arch, path, hf = alibi_case
    llm = _llm(path, **REGIMES[regime])
    prompts = make_prompts(seed=1, n=24)
    ties = assert_parity(hf, prompts, llm.generate(prompts, GREEDY))
    stats = llm.stats()
    assert stats["free_blocks"] == stats["total_blocks"]
    if regime == "preempt":
        assert stats["num_preemptions"] > 0
    print(f"{arch}/{regime}: {len(prompts)} prompts, near-tie divergences: {ties}")


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [16, pytest.param(32, marks=pytest.mark.heavy)])
def test_prefix_cache_parity(alibi_case, block_size):
    """The shared 100-token prefix comes from the cache for the second request on, its remaining tokens
    computed in chunks of 40 that start mid-block; then every prompt again, nearly whole from the cache."""
    arch, path, hf = alibi_case
    llm = _llm(path, num_kv_blocks=1024, block_size=block_size, max_num_batched_tokens=40)
    prompts = shared_prefix_prompts(seed=2)
    first = llm.generate(prompts[:1], GREEDY)
    hits = llm.stats()["prefix_cache_hit_tokens"]
    rest = llm.generate(prompts[1:], GREEDY)
    assert llm.stats()["prefix_cache_hit_tokens"] - hits >= 7 * (100 // block_size) * block_size
    assert all(o.cached_tokens >= (100 // block_size) * block_size for o in rest)
    ties = assert_parity(hf, prompts, first + rest)
    again = llm.generate(prompts, GREEDY)
    assert all(o.cached_tokens > 0 for o in again)
    ties += assert_parity(hf, prompts, again)
    print(f"{arch}/prefix bs={block_size}: near-tie divergences: {ties}")


@pytest.mark.slow
@pytest.mark.heavy
def test_parity_needs_the_bias(alibi_case):
    """The control: with the slopes zeroed (no position information at all) the tokens are not HF's,
    so the parity above depends on the bias being applied at the right positions."""
    arch, path, hf = alibi_case
    llm = _llm(path)
    llm.core.runner.model.alibi_slopes.zero_()
    prompts = make_prompts(seed=1, n=8)[2:]  # lengths 15..300: positions matter
    outs = llm.generate(prompts, GREEDY)
    assert sum(o.token_ids != hf.run(p)[0] for p, o in zip(prompts, outs, strict=True)) >= len(prompts) // 2


@pytest.mark.parametrize("num_heads", list(range(1, 25)))
def test_slopes_equal_transformers(num_heads):
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    assert torch.equal(bloom_slopes(num_heads), _get_alibi_slopes(num_heads, torch.device("cpu")))
    # MPT's tensor is slope * (k - (L - 1)) for L = 2 keys: its first column is -slope
    want = -build_mpt_alibi_tensor(num_heads, 2)[:, 0, 0]
    assert torch.equal(mpt_slopes(num_heads), want.float())


@pytest.mark.slow  # 40 s on two loaded cores: four engines
def test_checkpoint_errors_and_dummy_weights(alibi_case, tmp_path):
    """A checkpoint missing a weight, or with one our model lacks, is refused by name; load_format
    "dummy" builds the same model with random weights (benchmarks); int8 weight-only quantization runs."""
    import shutil

    from safetensors.torch import load_file, save_file

    arch, path, _ = alibi_case
    tensors = load_file(str(path / "model.safetensors"))
    qkv = next(n for n in tensors if n.endswith(("query_key_value.weight", "Wqkv.weight")))
    cases = {
        "lacks weights for: layers.0.self_attn.qkv": lambda t: t.pop(qkv),
        "unexpected weight 'extra'": lambda t: t.update(extra=t[qkv].clone()),
    }
    for i, (match, edit) in enumerate(cases.items()):
        bad = tmp_path / str(i)
        shutil.copytree(path, bad)
        changed = dict(tensors)
        edit(changed)
        save_file(changed, str(bad / "model.safetensors"))
        with pytest.raises(ValueError, match=match):
            _llm(bad, num_kv_blocks=16)
    llm = _llm(path, num_kv_blocks=64, load_format="dummy")
    assert isinstance(llm.core.runner.model, AlibiForCausalLM)
    assert len(llm.generate([[1, 2, 3]], GREEDY)[0].token_ids) == GREEDY.max_tokens
    # int8 weights (kernels.quant_linear): the tied embedding is looked up from its int8 rows
    llm = _llm(path, num_kv_blocks=64, quantization="int8")
    assert len(llm.generate([[1, 2, 3]], GREEDY)[0].token_ids) == GREEDY.max_tokens
