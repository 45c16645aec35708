"""kernels.qkv_new_token (the qkv projection with the new token's norm, RoPE, row scale and K/V store in
its epilogue) vs reference.qkv_new_token."""

from __future__ import annotations

import pytest
import torch

from kernels import reference as ref
from kernels.qkv_new_token import qkv_new_token
from tests.kernels.paged import gpu, max_err

# max abs error: the GEMM's summation order; 16-bit results may differ by a rounding step or two
ATOL = {torch.float32: 1e-4, torch.float16: 8e-3, torch.bfloat16: 6e-2}
EPS, ROW_EPS = 1e-6, 1e-5


def _randn(*shape, dtype, device, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)


def _check(dtype, device, m, h, hk, d, hidden, with_norm, config=None):
    heads = h + 2 * hk
    x = _randn(m, hidden, dtype=dtype, device=device, seed=0) * 3  # rms ~3: the row scale matters
    w = _randn(heads * d, hidden, dtype=dtype, device=device, seed=1) * hidden**-0.5
    qw = (1 + 0.2 * _randn(d, dtype=torch.float32, device=device, seed=2)).to(dtype) if with_norm else None
    kw = (1 + 0.2 * _randn(d, dtype=torch.float32, device=device, seed=3)).to(dtype) if with_norm else None
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    cos_sin = ref.rope_cos_sin(inv_freq, 512).to(device)
    pos = torch.randint(0, 512, (m,), generator=torch.Generator().manual_seed(4)).to(device)
    blocks, bs = m // 4 + 2, 16
    slots = torch.randperm(blocks * bs, generator=torch.Generator().manual_seed(5))[:m]
    slots[1::5] = -1  # padding rows write nothing
    slots = slots.to(device)
    caches = [_randn(blocks, bs, hk, d, dtype=dtype, device=device, seed=s) for s in (6, 7)]
    want = [c.clone() for c in caches]
    q_want = ref.qkv_new_token(x, w, h, hk, qw, kw, EPS, ROW_EPS, pos, cos_sin, *want, slots)
    q = qkv_new_token(x, w, h, hk, qw, kw, EPS, ROW_EPS, pos, cos_sin, *caches, slots, config=config)
    assert q.shape == (m, h, d)
    assert max_err(q, q_want) < ATOL[dtype]
    assert max_err(caches[0], want[0]) < ATOL[dtype]
    assert max_err(caches[1], want[1]) < ATOL[dtype]
    written = slots[slots >= 0]
    untouched = torch.ones(blocks * bs, dtype=torch.bool, device=device)
    untouched[written] = False
    fresh = [_randn(blocks, bs, hk, d, dtype=dtype, device=device, seed=s) for s in (6, 7)]
    for c, c0 in zip(caches, fresh, strict=True):
        assert torch.equal(c.view(blocks * bs, hk, d)[untouched], c0.view(blocks * bs, hk, d)[untouched])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_norm", [True, False])
@pytest.mark.parametrize("m", [1, 5, 21])
def test_qkv_new_token(dtype, with_norm, m):
    _check(dtype, "cpu", m, 4, 2, 16, 64, with_norm)


@pytest.mark.parametrize("with_norm", [True, False])
def test_qkv_new_token_with_and_without_qk_norms(with_norm):
    """1 / rms from the diagonal of x x^T, tiles by tensor descriptors (x aligned)."""
    _check(torch.float32, "cpu", 21, 2, 1, 32, 128, with_norm, config=(16, 32, 4, 1))


def test_qkv_new_token_unaligned_rows_take_pointers(monkeypatch):
    """x whose rows are not 16-byte aligned (a view at an odd offset) cannot be a TMA source: the launch
    builds no tensor descriptor for it and reads it by pointers, same results; an aligned x takes TMA."""
    from kernels import qkv_new_token as mod

    made = []
    descriptors = mod._descriptors
    monkeypatch.setattr(mod, "_descriptors", lambda *a: made.append(a[0]) or descriptors(*a))
    buf = torch.randn(21 * 64 + 1)
    w = torch.randn(8 * 16, 64) * 0.125
    pos, cs = torch.arange(21), ref.rope_cos_sin(1.0 / (10000 ** (torch.arange(0, 16, 2) / 16)), 64)
    slots = torch.arange(21)
    for x, takes_tma in ((buf[1:].view(21, 64), False), (buf[:-1].view(21, 64), True)):
        made.clear()
        caches = [torch.zeros(8, 16, 2, 16) for _ in range(4)]
        q = mod.qkv_new_token(x, w, 4, 2, None, None, EPS, ROW_EPS, pos, cs, *caches[:2], slots)
        q_want = ref.qkv_new_token(x.clone(), w, 4, 2, None, None, EPS, ROW_EPS, pos, cs, *caches[2:], slots)
        assert (len(made) == 1 and made[0] is x) if takes_tma else not made
        assert max_err(q, q_want) < ATOL[torch.float32]
        assert max_err(caches[0], caches[2]) < ATOL[torch.float32]
        assert max_err(caches[1], caches[3]) < ATOL[torch.float32]


def test_qkv_new_token_tiles():
    """Rows over several row tiles and a K loop of several steps, head_dim 32."""
    _check(torch.float32, "cpu", 37, 2, 1, 32, 96, True, config=(16, 32, 4, 1))


def test_qkv_new_token_rejects_bad_shapes():
    x = torch.zeros(3, 64)
    w = torch.zeros(8 * 16, 64)
    cs = torch.zeros(8, 16)
    cache = torch.zeros(2, 16, 2, 16)
    ints = torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="weight"):
        qkv_new_token(x, w[:-1], 4, 2, None, None, EPS, EPS, ints, cs, cache, cache, ints)
    with pytest.raises(ValueError, match="cache shape"):
        qkv_new_token(x, w, 4, 2, None, None, EPS, EPS, ints, cs, cache[:, :, :1], cache[:, :, :1], ints)
    with pytest.raises(ValueError, match="positions"):
        qkv_new_token(x, w, 4, 2, None, None, EPS, EPS, ints[:2], cs, cache, cache, ints)
    with pytest.raises(ValueError, match="norm weights"):
        qkv_new_token(x, w, 4, 2, cs[0, :8], cs[0, :8], EPS, EPS, ints, cs, cache, cache, ints)
    with pytest.raises(ValueError, match="go together"):
        qkv_new_token(x, w, 4, 2, cs[0], None, EPS, EPS, ints, cs, cache, cache, ints)


@pytest.mark.parametrize("m", [7, 64, 200])
@gpu
def test_gpu_qkv_new_token(m):
    """bf16 at Qwen3-0.6B's shape, each row-count configuration (TMA tiles, 1 / rms by x x^T)."""
    _check(torch.bfloat16, "cuda", m, 16, 8, 128, 1024, True)


def test_qkv_new_token_supports():
    """The shapes the GPU configurations take: heads of twice a power of two, hidden a multiple of every
    configuration's BLOCK_K (dispatch.qkv_epilogue_fits asks)."""
    from kernels.qkv_new_token import CONFIGS, supports

    step = max(c[1] for c in CONFIGS.values())
    assert supports(8 * step, 128) and supports(8 * step, 64)
    assert not supports(8 * step + step // 2, 128)
    assert not supports(8 * step, 96) and not supports(8 * step, 0)


def test_the_epilogue_path_needs_sm90(monkeypatch):
    """dispatch takes the epilogue path (its tiles want sm_90's shared memory) only from compute
    capability 9: an sm_89 card keeps cuBLAS's projection and the fused attention launch. The device is
    stood in for (use_triton, the capability); everything else qkv_epilogue_fits asks is real."""
    from kernels import dispatch, dispatch_linear
    from kernels import qkv_new_token as mod

    monkeypatch.setattr(dispatch_linear, "use_triton", lambda t: True)
    x = torch.zeros(dispatch_linear.QKV_EPILOGUE_MIN_M, 1024, dtype=torch.bfloat16)
    w = torch.zeros(32 * 128, 1024, dtype=torch.bfloat16)
    try:
        for major, want in ((8, False), (9, True), (10, True)):
            monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None, m=major: (m, 0))
            mod.hopper_or_later.cache_clear()
            assert dispatch.qkv_epilogue_fits(x, w, 128) is want
        assert not dispatch.qkv_epilogue_fits(x[:-1], w, 128)  # below QKV_EPILOGUE_MIN_M rows
    finally:
        mod.hopper_or_later.cache_clear()


@pytest.mark.parametrize("m", [72, 256])
@gpu
def test_gpu_attention_released_by_the_projection(m):
    """A wide folded decode step's pair: qkv_new_token, then the decode attention, which it lets start
    early (after_release: programmatic dependent launch; the attention waits before q and the cache).
    Captured in CUDA graphs and replayed with q and the new tokens' cache rows cleared before each replay:
    the same bits as the attention launched without it, and the reference attention's result."""
    import random

    from kernels.decode_attention import paged_decode_attention
    from kernels.order import longest_first
    from tests.kernels.paged import GPU_ATOL, capture, make_paged

    h, hk, d, hidden, bs = 16, 8, 128, 1024, 32
    rng = random.Random(m)
    ctx = [rng.randint(100, 1500) for _ in range(m)]
    _, kc, vc, bt, _, sl = make_paged(ctx, [1] * m, h, hk, d, bs, torch.bfloat16, "cuda")
    pos = sl.long() - 1  # each sequence's new token is its last position
    slots = bt.gather(1, (pos // bs)[:, None]).squeeze(1).long() * bs + pos % bs
    x = _randn(m, hidden, dtype=torch.bfloat16, device="cuda", seed=0) * 3
    w = _randn((h + 2 * hk) * d, hidden, dtype=torch.bfloat16, device="cuda", seed=1) * hidden**-0.5
    qw, kw = (1 + 0.2 * _randn(d, dtype=torch.float32, device="cuda", seed=s) for s in (2, 3))
    qw, kw = qw.to(torch.bfloat16), kw.to(torch.bfloat16)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    cos_sin = ref.rope_cos_sin(inv_freq, 2048).cuda()

    def step(after: bool):
        order = longest_first(sl)  # sorted before the projection, as the engine does
        q = qkv_new_token(x, w, h, hk, qw, kw, EPS, ROW_EPS, pos, cos_sin, kc, vc, slots)
        out = paged_decode_attention(q, kc, vc, bt, sl, d**-0.5, num_splits=1, order=order,
                                     after_release=after)  # fmt: skip
        return q, out

    outs = {}
    for after in (False, True):
        step(after)  # compiled before the capture
        graph, (q, out) = capture(lambda a=after: step(a))
        got = []
        for _ in range(3):
            q.zero_()
            for c in (kc, vc):
                c.view(-1, hk, d)[slots] = 0
            graph.replay()
            torch.cuda.synchronize()
            got.append(out.clone())
        outs[after] = (got, q.clone())
    (off, q_off), (on, q_on) = outs[False], outs[True]
    assert torch.equal(q_on, q_off)
    for o in off + on:
        assert torch.equal(o, off[0])
    want = ref.decode_attention(q_off, kc, vc, bt, sl, d**-0.5)
    assert max_err(on[0], want) < GPU_ATOL[torch.bfloat16]
