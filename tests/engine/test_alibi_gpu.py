"""The ALiBi family on the GPU path (Triton paged kernels with the slopes, CUDA graphs on): float32
greedy tokens equal HF's CPU float32 ones up to 1e-4 near-ties, plain, with a small token budget
(chunked prefill), and after a cached prefix; bfloat16 runs through the same graphs."""

from __future__ import annotations

import pytest
import torch

from engine import LLM
from tests.alibi_models import build_alibi_checkpoint
from tests.engine.test_parity import GREEDY, HFReference, assert_parity, make_prompts, shared_prefix_prompts

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

SHAPES = {"bloom": dict(hidden_size=384, n_head=6), "mpt": dict(d_model=384, n_heads=6)}  # head_dim 64


@pytest.fixture(scope="module", params=list(SHAPES))
def case(request, tmp_path_factory):
    path = build_alibi_checkpoint(tmp_path_factory.mktemp(f"gpu-{request.param}"), request.param,
                                  **SHAPES[request.param])  # fmt: skip
    return request.param, path, HFReference(path)


@pytest.mark.parametrize("kwargs", [{}, {"max_num_batched_tokens": 64}, {"block_size": 16}])
def test_fp32_parity(case, kwargs):
    arch, path, hf = case
    llm = LLM(str(path), device="cuda", dtype="float32", num_kv_blocks=1024, **kwargs)
    prompts = make_prompts(seed=1, n=24)
    ties = assert_parity(hf, prompts, llm.generate(prompts, GREEDY))
    shared = shared_prefix_prompts(seed=2)
    ties += assert_parity(hf, shared[:1], llm.generate(shared[:1], GREEDY))
    rest = llm.generate(shared[1:], GREEDY)
    assert all(o.cached_tokens > 0 for o in rest)
    ties += assert_parity(hf, shared[1:], rest)
    print(f"{arch} {kwargs}: near-tie divergences {ties}")


def test_bf16_runs_through_the_graphs(case):
    _, path, _ = case
    llm = LLM(str(path), device="cuda", dtype="bfloat16", num_kv_blocks=1024)
    assert llm.core.runner.graphs is not None
    outs = llm.generate(make_prompts(seed=3, n=16), GREEDY)
    assert all(len(o.token_ids) == GREEDY.max_tokens for o in outs)
