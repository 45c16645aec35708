"""kernels.lm_head_sample: the fused lm_head + draw gives sample_tokens' token on the logits it writes."""

from __future__ import annotations

import pytest
import torch

from kernels import _jit
from kernels import reference as ref
from kernels.lm_head_sample import lm_head_sample
from kernels.sampling import sample_tokens
from tests.kernels.paged import gpu

TEMPS = {1: [0.7], 2: [0.0, 1.3], 3: [1.3, 0.0, 0.7]}  # greedy and sampled rows
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}  # rtol: an ulp either way of the rounding


def _inputs(m: int, n: int, k: int, dtype, seed: int = 0, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype).to(device)
    w = (torch.randn(n, k, generator=g) * k**-0.5 * 3).to(dtype).to(device)  # logits ~ N(0, 9)
    return x, w


def unfused(x, weight, temperatures, seed):  # (M,) tokens, (M, N) logits in x's dtype
    """The two steps the kernel fuses: fp32 logits rounded to x's dtype, then kernels.sampling's draw."""
    logits = (x.float() @ weight.float().T).to(x.dtype)
    return sample_tokens(logits, temperatures, seed), logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m", [1, 2, 3])
def test_tokens_equal_sample_tokens_on_the_logits(dtype, m):
    n, k = 1003, 96  # N not a multiple of BLOCK_N, K not of BLOCK_K: the masked path
    x, w = _inputs(m, n, k, dtype, seed=m)
    temps = torch.tensor(TEMPS[m])
    logits = torch.empty(m, n, dtype=dtype)
    got = lm_head_sample(x, w, temps, 1234, logits_out=logits)
    assert got.dtype == torch.int64 and got.shape == (m,)
    assert torch.equal(got, sample_tokens(logits, temps, 1234))  # exact: the same logits, the same draw
    want, ref_logits = unfused(x, w, temps, 1234)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=TOL[dtype])
    assert torch.equal(got, want)  # the fp32 sum order differs from torch's, yet no token is that close
    if m == 3:  # the sampled rows are drawn, not the argmax
        assert got[0] != logits[0].float().argmax() and got[2] != logits[2].float().argmax()
    # the seed from a device tensor (read at run time) and into a static out buffer: the same draw
    out = torch.full((m,), -1, dtype=torch.int64)
    assert lm_head_sample(x, w, temps, torch.tensor([1234]), out=out) is out
    assert torch.equal(out, got)


@pytest.mark.parametrize(("n", "k", "programs"), [(512, 64, 5), (203, 96, 8), (203, 96, 1), (512, 64, 32)])
def test_every_program_count_gives_the_same_draw(n, k, programs):
    # each program walks its blocks, the next asked before the current is scored (the last request runs
    # past N, masked); K below its power of two is masked too: the same draw as sample_tokens on the
    # logits it writes, whatever the number of programs and the block size (N = 203: 26 blocks of 8, so
    # one program walks them all and eight share them unevenly)
    x, w = _inputs(2, n, k, torch.float32, seed=9)
    temps = torch.tensor([0.0, 1.1])
    logits = torch.empty(2, n)
    got = lm_head_sample(x, w, temps, 5, logits_out=logits, block_n=8, num_programs=programs)
    assert torch.equal(got, sample_tokens(logits, temps, 5))
    assert torch.allclose(logits, x @ w.T, rtol=1e-5, atol=1e-5)
    # blocks of 4 rows: one Philox counter a block
    assert torch.equal(lm_head_sample(x, w, temps, 5, block_n=4, num_programs=7), got)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_greedy_is_argmax_with_ties_to_the_lowest_index(dtype):
    n, k = 700, 64
    x, w = _inputs(2, n, k, dtype, seed=3)
    w[300] = (x[0].float() / x[0].float().norm() * 4).to(dtype)  # row 0's maximum ...
    w[650] = w[301] = w[300]  # ... tied by a later block (another program) and by the next row
    w[20] = (x[1].float() / x[1].float().norm() * 4).to(dtype)
    w[21] = w[20]  # row 1: tied in the same block
    temps = torch.zeros(2)
    logits = torch.empty(2, n, dtype=dtype)
    got = lm_head_sample(x, w, temps, 9, logits_out=logits)
    assert logits[0, 300] == logits[0, 650] == logits[0, 301] == logits[0].max()
    assert logits[1, 20] == logits[1, 21] == logits[1].max()
    assert got.tolist() == [300, 20]
    assert torch.equal(got, logits.float().argmax(dim=-1))


def test_arrival_counter_is_left_zeroed():
    x, w = _inputs(1, 300, 32, torch.float32, seed=4)
    temps = torch.tensor([1.0])
    first = lm_head_sample(x, w, temps, 5)
    counter = _jit._COUNTERS[("lm_head_sample", "cpu", None)]
    assert int(counter.abs().sum()) == 0
    assert torch.equal(lm_head_sample(x, w, temps, 5), first)  # the second launch reduces again
    assert int(counter.abs().sum()) == 0
    logits = torch.empty(1, 300)
    assert torch.equal(lm_head_sample(x, w, temps, 6, logits_out=logits), sample_tokens(logits, temps, 6))


def test_last_program_ends_the_step():
    # advance_seed and publish: the same draw, then the seed advanced once and the tokens in ring row
    # counter % slots with the counter advanced, over several launches (as kernels.publish)
    x, w = _inputs(2, 300, 32, torch.float32, seed=13)
    temps = torch.tensor([0.9, 0.0])
    seed, ring, count = torch.tensor([77]), torch.full((3, 4), -1, dtype=torch.int64), torch.tensor([4])
    for launch in range(4):  # the ring wraps at the fourth
        want = lm_head_sample(x, w, temps, 77 + launch)
        out = torch.full((2,), -1, dtype=torch.int64)
        lm_head_sample(x, w, temps, seed, out=out, num_programs=8, advance_seed=True, publish=(ring, count))
        assert torch.equal(out, want) and seed.item() == 78 + launch and count.item() == 5 + launch
        assert ring[(4 + launch) % 3, :2].tolist() == want.tolist() and ring[:, 2:].eq(-1).all()
    with pytest.raises(ValueError, match="advance_seed needs"):
        lm_head_sample(x, w, temps, 5, advance_seed=True)
    with pytest.raises(ValueError, match="the ring must be"):
        lm_head_sample(x, w, temps, seed, publish=(torch.zeros(3, 1, dtype=torch.int64), count))
    with pytest.raises(ValueError, match="ring's counter"):
        lm_head_sample(x, w, temps, seed, publish=(ring, torch.tensor([1], dtype=torch.int32)))


def test_dispatch_ends_the_step_the_same_way_unfused():
    # kernels.dispatch.lm_head_sample off the fused launch (here: the CPU): norm, lm_head and draw one
    # by one, then the seed and the ring as the fused launch leaves them
    from kernels import dispatch

    x, w = _inputs(1, 300, 32, torch.float32, seed=14)
    residual, nw = _inputs(1, 32, 32, torch.float32, seed=15)[0], torch.rand(32) + 0.5
    temps, seed = torch.tensor([0.0]), torch.tensor([8])
    ring, count = torch.zeros((2, 1), dtype=torch.int64), torch.tensor([1])
    out = torch.empty(1, dtype=torch.int64)
    normed = ref.fused_add_rms_norm(x.clone(), residual.clone(), nw, 1e-6)[0]
    want = (normed @ w.T).argmax(dim=-1)
    assert dispatch.lm_head_sample(x, residual, nw, 1e-6, w, temps, seed, out, (ring, count)) is out
    assert torch.equal(out, want) and seed.item() == 9 and count.item() == 2
    assert ring[1].tolist() == want.tolist()


def test_seed_is_not_specialized():
    from triton.runtime.jit import JITFunction

    from kernels.lm_head_sample import _lm_head_sample_kernel

    jf = JITFunction(_lm_head_sample_kernel.fn, **_lm_head_sample_kernel.jit_kwargs)
    assert [p.name for p in jf.params if p.do_not_specialize] == ["seed"]


BAD = [
    ("x must be", dict(x=torch.zeros(5, 8))),  # M > 4
    ("x must be", dict(x=torch.zeros(2, 8, dtype=torch.int32), weight=torch.zeros(40, 8, dtype=torch.int32))),
    ("weight must be", dict(weight=torch.zeros(40, 9))),
    ("weight must be", dict(weight=torch.zeros(40, 8, dtype=torch.float16))),
    ("weight must be", dict(weight=torch.zeros(0, 8))),
    ("temperatures must be", dict(temperatures=torch.zeros(3))),
    ("temperatures must be", dict(temperatures=torch.zeros(2, dtype=torch.float64))),
    ("seed tensor", dict(seed=torch.tensor([1], dtype=torch.int32))),
    ("out must be", dict(out=torch.zeros(2, dtype=torch.int32))),
    ("logits_out must be", dict(logits_out=torch.zeros(2, 41))),
    ("logits_out must be", dict(logits_out=torch.zeros(2, 40, dtype=torch.float16))),
    ("block_n must be", dict(block_n=2)),
    ("block_n must be", dict(block_n=12)),
    ("x must be", dict(x=torch.zeros(2, 4097), weight=torch.zeros(40, 4097))),  # K > MAX_K
    ("num_programs must be", dict(num_programs=0)),
    ("num_programs must be", dict(block_n=8, num_programs=6)),  # 5 blocks of 8 rows
]


@pytest.mark.parametrize(("match", "change"), BAD)
def test_bad_arguments_are_named(match, change):
    args = dict(x=torch.zeros(2, 8), weight=torch.zeros(40, 8), temperatures=torch.zeros(2), seed=1) | change
    with pytest.raises(ValueError, match=match):
        lm_head_sample(**args)


@gpu
@pytest.mark.parametrize("m", [1, 4])
def test_gpu_real_shape_bf16(m):
    n, k = 151936, 1024
    x, w = _inputs(m, n, k, torch.bfloat16, seed=7, device="cuda")
    for temps in ([0.0] * m, [0.8] * m):
        t = torch.tensor(temps, device="cuda")
        logits = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        got = lm_head_sample(x, w, t, 42, logits_out=logits)
        assert torch.equal(got, sample_tokens(logits, t, 42))
        want = torch.nn.functional.linear(x, w)
        torch.testing.assert_close(logits.float(), want.float(), atol=3e-2, rtol=1e-2)
    # replayed from a CUDA graph with the seed read at run time
    seed, out = torch.tensor([1], device="cuda"), torch.empty(m, dtype=torch.int64, device="cuda")
    lm_head_sample(x, w, t, seed, out=out, logits_out=logits)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lm_head_sample(x, w, t, seed, out=out, logits_out=logits)
    for s in (2, 3):
        seed.fill_(s)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, sample_tokens(logits, t, s))
    # ending the step: the seed advanced and the tokens written into pinned host memory by the device
    ring = torch.full((4, m), -1, dtype=torch.int64, pin_memory=True)
    count = torch.tensor([2], device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lm_head_sample(x, w, t, seed, out=out, logits_out=logits, advance_seed=True, publish=(ring, count))
    seed.fill_(5)
    for replay in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, sample_tokens(logits, t, 5 + replay))
        assert ring[(2 + replay) % 4].tolist() == out.tolist() and seed.item() == 6 + replay
    assert count.item() == 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_final_norm(dtype):
    # the lm_head of rms_norm(x + residual): the logits of the reference norm within rounding, and the
    # tokens those logits draw
    x, w = _inputs(2, 1003, 96, dtype, seed=11)
    residual, nw = _inputs(2, 96, 96, dtype, seed=12)[0], torch.rand(96).to(dtype) + 0.5
    temps = torch.tensor([0.0, 0.8])
    logits = torch.empty(2, 1003, dtype=dtype)
    got = lm_head_sample(x, w, temps, 3, logits_out=logits, block_n=8, num_programs=8,
                         residual=residual, norm=(nw, 1e-6))  # fmt: skip
    assert torch.equal(got, sample_tokens(logits, temps, 3))
    normed = ref.fused_add_rms_norm(x, residual, nw, 1e-6)[0]
    want = (normed.float() @ w.float().T).to(dtype)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert torch.allclose(logits.float(), want.float(), rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="go together"):
        lm_head_sample(x, w, temps, 3, residual=residual)
