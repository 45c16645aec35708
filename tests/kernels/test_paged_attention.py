"""Paged prefill and split-K decode attention vs kernels.reference (interpreter on CPU; GPU tests below)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels import decode_launch as dl
from kernels import prefill_attention as pf
from kernels import reference as ref
from kernels.decode_attention import paged_decode_attention
from kernels.decode_launch import choose_num_splits
from kernels.prefill_attention import choose_prefill_splits, paged_prefill_attention
from tests.kernels.paged import ATOL, GPU_ATOL, alibi_slopes, capture, gpu, make_paged, max_err

H, HK, D = 4, 2, 16  # GQA: 2 query heads per KV head
SCALE = D**-0.5

# (context lengths, new-token counts): q_len == ctx is a fresh prefill, q_len < ctx a prefill after a
# cached prefix or a chunk of a longer prompt, q_len == 1 a decode step inside a mixed batch
PREFILL_CASES = {
    "fresh": ([19, 33], [19, 33]),
    "cached_prefix": ([40, 17], [8, 17]),
    "chunked_mixed": ([37, 50, 6], [5, 1, 6]),
}


def _prefill(dtype, block_size, case, window=None, alibi=False, heads=(H, HK), device="cpu"):
    ctx, qlens = PREFILL_CASES[case]
    h, hk = heads
    q, kc, vc, bt, cu, sl = make_paged(ctx, qlens, h, hk, D, block_size, dtype, device)
    slopes = alibi_slopes(h, device) if alibi else None
    out = paged_prefill_attention(q, kc, vc, bt, cu, sl, max(qlens), SCALE, window, slopes)
    return out, (q, kc, vc, bt, cu, sl, SCALE, window, slopes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("case", list(PREFILL_CASES))
def test_prefill_matches_reference(dtype, block_size, case):
    out, args = _prefill(dtype, block_size, case)
    assert out.dtype == dtype and out.shape == args[0].shape
    assert max_err(out, ref.paged_attention(*args)) < ATOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("window", "alibi"), [(7, False), (None, True), (20, True)])
def test_prefill_window_and_alibi(dtype, window, alibi):
    out, args = _prefill(dtype, 16, "cached_prefix", window, alibi)
    assert max_err(out, ref.paged_attention(*args)) < ATOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("case", "window", "alibi", "num_splits"), [
    ("cached_prefix", None, False, 2), ("chunked_mixed", None, False, 5), ("fresh", None, True, 3),
    ("cached_prefix", 11, False, 3),
])  # fmt: skip
def test_prefill_split_k(dtype, case, window, alibi, num_splits):
    # a short extend after a long cached prefix: keys split over programs, merged by the reduce kernel
    ctx, qlens = PREFILL_CASES[case]
    q, kc, vc, bt, cu, sl = make_paged(ctx, qlens, H, HK, D, 16, dtype)
    slopes = alibi_slopes(H) if alibi else None
    out = paged_prefill_attention(q, kc, vc, bt, cu, sl, max(qlens), SCALE, window, slopes,
                                  num_splits=num_splits)  # fmt: skip
    expect = ref.paged_attention(q, kc, vc, bt, cu, sl, SCALE, window, slopes)
    assert max_err(out, expect) < ATOL[dtype]


def test_choose_prefill_splits():
    assert choose_prefill_splits(32, 3764, 132) == 8  # M1's turn 10: 2 query tiles x 16 heads
    assert choose_prefill_splits(1024, 4096, 132) == 1  # enough programs already
    assert choose_prefill_splits(32, 300, 132) == 1  # short context: nothing to split


def test_prefill_mha_and_wide_groups():
    for heads in [(2, 2), (8, 1)]:
        out, args = _prefill(torch.float32, 16, "chunked_mixed", heads=heads)
        assert max_err(out, ref.paged_attention(*args)) < ATOL[torch.float32]


def test_prefill_skips_empty_sequences_and_small_max_seqlen_q_tiles():
    q, kc, vc, bt, cu, sl = make_paged([9, 12, 30], [0, 12, 3], H, HK, D, 16, torch.float32)
    out = paged_prefill_attention(q, kc, vc, bt, cu, sl, 12, SCALE)
    assert max_err(out, ref.paged_attention(q, kc, vc, bt, cu, sl, SCALE)) < ATOL[torch.float32]


def test_prefill_tile_map_lists_each_sequences_query_tiles():
    got = pf.prefill_tile_map(np.array([3, 0, 9, 1]), 4, 7)
    assert got.dtype == np.int32 and got.tolist() == [[0, 2, 2, 2, 3, -1, -1], [0, 0, 1, 2, 0, -1, -1]]
    assert pf.prefill_tile_map(np.array([], dtype=np.int64), 4, 2).tolist() == [[-1, -1], [-1, -1]]
    with pytest.raises(ValueError, match="do not fit"):
        pf.prefill_tile_map(np.array([9]), 4, 2)
    assert pf.prefill_block_m(torch.float32, torch.device("cpu")) == pf.PREFILL_CONFIGS["interpret"][0]


def _tile_mapped(ctx, qlens, pad_seqs, map_tiles, num_splits=None, device="cpu", dtype=torch.float32):
    """A batch laid out as a captured graph sees it: pad_seqs trailing sequences with no tokens and no
    context, a tile map longer than the batch needs, rows past the batch's tokens left unwritten."""
    q, kc, vc, bt, cu, sl = make_paged(ctx + [0] * pad_seqs, qlens + [0] * pad_seqs, H, HK, D, 16, dtype,
                                       device)  # fmt: skip
    block_m = pf.prefill_block_m(dtype, q.device)
    tiles = torch.from_numpy(pf.prefill_tile_map(np.array(qlens), block_m, map_tiles)).to(device)
    out = torch.full_like(q, 7.0)
    paged_prefill_attention(q, kc, vc, bt, cu, sl, 1, SCALE, out=out, tile_map=tiles, num_splits=num_splits)
    return out, ref.paged_attention(q, kc, vc, bt, cu, sl, SCALE)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_prefill_tile_map_matches_reference(num_splits):
    # decodes (one new token), a fresh prompt, a chunk after a cached prefix, then two empty sequences
    ctx, qlens = [20, 37, 19, 50], [1, 1, 19, 6]
    map_tiles = sum(-(-n // pf.PREFILL_CONFIGS["interpret"][0]) for n in qlens) + 5
    out, expect = _tile_mapped(ctx, qlens, 2, map_tiles, num_splits)
    assert max_err(out, expect) < ATOL[torch.float32]
    with pytest.raises(ValueError, match="tile_map"):
        q, kc, vc, bt, cu, sl = make_paged([4], [4], H, HK, D, 16, torch.float32)
        bad = torch.zeros(3, 2, dtype=torch.int32)
        paged_prefill_attention(q, kc, vc, bt, cu, sl, 4, SCALE, tile_map=bad)


def _decode(dtype, block_size, ctx, num_splits, window=None, alibi=False, device="cpu", **kw):
    q, kc, vc, bt, _, sl = make_paged(ctx, [1] * len(ctx), H, HK, D, block_size, dtype, device)
    slopes = alibi_slopes(H, device) if alibi else None
    out = paged_decode_attention(q, kc, vc, bt, sl, SCALE, window, slopes, num_splits=num_splits, **kw)
    return out, (q, kc, vc, bt, sl, SCALE, window, slopes)


DECODE_CTX = [1, 20, 75, 33]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("num_splits", [1, 3, 8])
def test_decode_matches_reference(dtype, block_size, num_splits):
    """Each program's block-table row read into registers once, its tiles' blocks gathered from there.
    8 splits of 75 keys leave some splits empty."""
    out, args = _decode(dtype, block_size, DECODE_CTX, num_splits)
    assert max_err(out, ref.decode_attention(*args)) < ATOL[dtype]
    launch = dl.decode_launch(*args[:6], num_splits=num_splits)
    assert launch.consts["BLOCK_T"] >= args[3].shape[1]  # the row's entries held in registers


@pytest.mark.parametrize("regs_max", [1, 2, 4, 7])
@pytest.mark.parametrize(
    ("window", "alibi", "num_splits"), [(None, False, 1), (None, False, 2), (30, True, 3)]
)
def test_decode_table_wider_than_registers_holds_part_of_it(regs_max, window, alibi, num_splits, monkeypatch):
    """A block table wider than TABLE_REGS_MAX entries (rounded down to a power of two): each program
    holds that many entries from its split's first block and walks a longer split in chunks, reading
    each next chunk's entries (2 entries cover one 16-key chunk: 75 keys take 5), with the result of the
    whole row held (the same tiles in the same order)."""
    out, args = _decode(torch.float32, 16, DECODE_CTX, num_splits, window, alibi)
    assert max_err(out, ref.decode_attention(*args)) < ATOL[torch.float32]
    monkeypatch.setattr(dl, "TABLE_REGS_MAX", regs_max)
    launch = dl.decode_launch(*args[:6], num_splits=num_splits, sliding_window=window, alibi_slopes=args[-1])
    held = max(1 << (regs_max.bit_length() - 1), 2)  # at least a 16-key tile's chunk (one entry more)
    assert launch.consts["BLOCK_T"] == held and launch.consts["TABLE_PART"]
    part, _ = _decode(torch.float32, 16, DECODE_CTX, num_splits, window, alibi)
    assert torch.equal(part, out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("window", "alibi", "num_splits"), [(9, False, 1), (30, False, 4), (None, True, 3), (25, True, 2)]
)
def test_decode_window_and_alibi(dtype, window, alibi, num_splits):
    out, args = _decode(dtype, 16, DECODE_CTX, num_splits, window, alibi)
    assert max_err(out, ref.decode_attention(*args)) < ATOL[dtype]


def test_decode_equals_prefill_of_one_token():
    ctx = [20, 75]
    q, kc, vc, bt, cu, sl = make_paged(ctx, [1, 1], H, HK, D, 16, torch.float32)
    dec = paged_decode_attention(q, kc, vc, bt, sl, SCALE, num_splits=2)
    pre = paged_prefill_attention(q, kc, vc, bt, cu, sl, 1, SCALE)
    assert max_err(dec, pre) < 1e-5


def test_decode_auto_splits_out_buffer_and_empty_sequence():
    q, kc, vc, bt, _, sl = make_paged([40, 1], [1, 1], H, HK, D, 16, torch.float32)
    out = torch.full_like(q, float("nan"))
    res = paged_decode_attention(q, kc, vc, bt, sl, SCALE, out=out, max_seq_len=64)
    assert res is out
    assert max_err(out, ref.decode_attention(q, kc, vc, bt, sl, SCALE)) < ATOL[torch.float32]
    sl[1] = 0  # a padding row of a CUDA-graph batch: zeros, never NaN
    out = paged_decode_attention(q, kc, vc, bt, sl, SCALE, num_splits=4)
    assert torch.all(out[1] == 0) and not out.isnan().any()


def test_decode_order_and_head_major_change_no_value():
    """A wide batch (batch x KV heads >= SMs; the interpreter counts 4) dispatched longest first and a
    sequence's KV heads side by side: every row equals the dispatch in row order's, bit for bit; a
    split launch of the same batch is not head-major."""
    ctx = [3, 75, 20, 1, 48]
    q, kc, vc, bt, _, sl = make_paged(ctx, [1] * len(ctx), H, HK, D, 16, torch.float32)
    plain = paged_decode_attention(q, kc, vc, bt, sl, SCALE, num_splits=1)
    assert dl.wants_order(len(ctx), HK, q.device)
    launch = dl.decode_launch(q, kc, vc, bt, sl, SCALE, num_splits=1, order=torch.zeros(5, dtype=torch.int32))
    assert launch.grid == (HK, 5, 1) and launch.consts["ORDERED"] and launch.consts["HEAD_MAJOR"]
    assert dl.decode_launch(q, kc, vc, bt, sl, SCALE, num_splits=2).grid == (5, HK, 2)
    order = dl.longest_first(sl)
    assert order.dtype == torch.int32 and order.tolist() == [1, 4, 2, 0, 3]
    ordered = paged_decode_attention(q, kc, vc, bt, sl, SCALE, num_splits=1, order=order)
    assert torch.equal(ordered, plain)
    assert max_err(plain, ref.decode_attention(q, kc, vc, bt, sl, SCALE)) < ATOL[torch.float32]
    with pytest.raises(ValueError, match="order"):
        paged_decode_attention(q, kc, vc, bt, sl, SCALE, num_splits=1, order=order.long())


def test_wants_order():
    cpu = torch.device("cpu")  # counted as 4 SMs
    assert dl.wants_order(2, 2, cpu) and not dl.wants_order(1, 2, cpu)


def test_choose_num_splits():
    assert choose_num_splits(1, 8, 4096, 132) == 32  # limited by >= 128 keys per split
    assert choose_num_splits(1, 8, 100_000, 132) == 33  # ~2 waves of programs
    assert choose_num_splits(64, 8, 4096, 132) == 1
    assert choose_num_splits(17, 8, 4096, 132) == 1  # 136 programs fill the SMs: no reduce launch
    assert choose_num_splits(16, 8, 4096, 132) == 3
    assert choose_num_splits(4, 8, 0, 132) == 1


def test_launcher_rejects_bad_shapes():
    q, kc, vc, bt, cu, sl = make_paged([8], [8], H, HK, D, 16, torch.float32)
    with pytest.raises(ValueError):
        paged_prefill_attention(q, kc, vc, bt.long(), cu, sl, 8, SCALE)
    with pytest.raises(ValueError):
        paged_prefill_attention(q[:, :3], kc, vc, bt, cu, sl, 8, SCALE)
    with pytest.raises(ValueError):
        paged_decode_attention(q, kc.half(), vc, bt, sl, SCALE)


# ---------------------------------------------------------------- GPU (bf16, and fp32 without TF32)

GPU_H, GPU_HK, GPU_D = 16, 8, 128


@pytest.fixture
def no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _fp32_args(args):
    return [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize(("window", "alibi"), [(None, False), (100, False), (None, True)])
@pytest.mark.parametrize("splits", [None, 1, 4])
@pytest.mark.usefixtures("no_tf32")
@gpu
def test_gpu_prefill(dtype, block_size, window, alibi, splits):
    ctx, qlens = [300, 513, 128, 77], [300, 130, 1, 64]
    q, kc, vc, bt, cu, sl = make_paged(ctx, qlens, GPU_H, GPU_HK, GPU_D, block_size, dtype, "cuda")
    slopes = alibi_slopes(GPU_H, "cuda") if alibi else None
    scale = GPU_D**-0.5
    out = paged_prefill_attention(q, kc, vc, bt, cu, sl, max(qlens), scale, window, slopes, num_splits=splits)
    # the reference runs in fp32 on the same (rounded) inputs: the bf16 kernel is judged against exact math
    expect = ref.paged_attention(*_fp32_args([q, kc, vc, bt, cu, sl, scale, window, slopes]))
    assert max_err(out, expect) < GPU_ATOL[dtype]


@pytest.mark.usefixtures("no_tf32")
@gpu
def test_gpu_prefill_tile_map_in_cuda_graph():
    # one capture replayed over two batches of other lengths, as runner.batch_graphs does
    block_m = pf.prefill_block_m(torch.bfloat16, torch.device("cuda"))
    batches = [([300, 513, 128, 77], [300, 130, 1, 64]), ([40, 1000, 9, 0], [1, 700, 9, 0])]
    made = [make_paged(c, q, GPU_H, GPU_HK, GPU_D, 16, torch.bfloat16, "cuda", spare_blocks=80, seed=i)
            for i, (c, q) in enumerate(batches)]  # fmt: skip
    rows = max(m[0].shape[0] for m in made)
    width = max(m[3].shape[1] for m in made)
    static_q = torch.zeros(rows, GPU_H, GPU_D, dtype=torch.bfloat16, device="cuda")
    kc = torch.zeros((max(m[1].shape[0] for m in made), *made[0][1].shape[1:]), dtype=torch.bfloat16,
                     device="cuda")  # fmt: skip
    vc = torch.zeros_like(kc)
    bt = torch.zeros(4, width, dtype=torch.int32, device="cuda")
    cu = torch.zeros(5, dtype=torch.int32, device="cuda")
    sl = torch.zeros(4, dtype=torch.int32, device="cuda")
    tiles = torch.zeros(2, rows // block_m + 5, dtype=torch.int32, device="cuda")
    out = torch.zeros_like(static_q)
    scale = GPU_D**-0.5

    def load(i):
        q, k, v, t, c, s = made[i]
        kc[: k.shape[0]] = k
        vc[: v.shape[0]] = v
        static_q.zero_()
        static_q[: q.shape[0]] = q
        bt.zero_()
        bt[:, : t.shape[1]] = t
        cu.copy_(c)
        sl.copy_(s)
        tiles.copy_(torch.from_numpy(pf.prefill_tile_map(np.diff(c.cpu().numpy()), block_m, tiles.shape[1])))
        return q.shape[0]

    load(0)
    run = lambda: paged_prefill_attention(static_q, kc, vc, bt, cu, sl, 1, scale, out=out, tile_map=tiles)
    run()
    graph, _ = capture(run)
    for i in (1, 0):
        n = load(i)
        graph.replay()
        expect = ref.paged_attention(*_fp32_args([static_q[:n], kc, vc, bt, cu, sl, scale]))
        assert max_err(out[:n], expect) < GPU_ATOL[torch.bfloat16]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("num_splits", [None, 1, 7])
@pytest.mark.parametrize(("window", "alibi"), [(None, False), (200, False), (None, True)])
@pytest.mark.usefixtures("no_tf32")
@gpu
def test_gpu_decode(dtype, num_splits, window, alibi):
    ctx = [1, 17, 512, 1000, 4096, 2049]
    q, kc, vc, bt, _, sl = make_paged(ctx, [1] * len(ctx), GPU_H, GPU_HK, GPU_D, 16, dtype, "cuda")
    slopes = alibi_slopes(GPU_H, "cuda") if alibi else None
    scale = GPU_D**-0.5
    out = paged_decode_attention(q, kc, vc, bt, sl, scale, window, slopes, num_splits=num_splits)
    expect = ref.decode_attention(*_fp32_args([q, kc, vc, bt, sl, scale, window, slopes]))
    assert max_err(out, expect) < GPU_ATOL[dtype]


@pytest.mark.parametrize("num_splits", [1, 3])
@gpu
def test_gpu_decode_table_wider_than_registers(num_splits):
    """Tables 2,560 entries wide (the engine's graphs at 40,960 positions), part of each held: a
    split of 12,000 keys walks two chunks of held entries; bf16 against the fp32 reference."""
    ctx = [1, 17, 5000, 9000, 12000, 300]
    q, kc, vc, bt, _, sl = make_paged(ctx, [1] * len(ctx), GPU_H, GPU_HK, GPU_D, 16, torch.bfloat16, "cuda")
    wide = torch.nn.functional.pad(bt, (0, 2560 - bt.shape[1]))
    scale = GPU_D**-0.5
    launch = dl.decode_launch(q, kc, vc, wide, sl, scale, num_splits=num_splits)
    assert launch.consts["TABLE_PART"] and launch.consts["BLOCK_T"] == 512
    out = paged_decode_attention(q, kc, vc, wide, sl, scale, num_splits=num_splits)
    expect = ref.decode_attention(*_fp32_args([q, kc, vc, bt, sl, scale]))
    assert max_err(out, expect) < GPU_ATOL[torch.bfloat16]


@gpu
def test_gpu_wide_decode_longest_first_in_cuda_graph():
    """The W2 regime: batch x KV heads >= SMs, the rows sorted on the device inside the graph (as
    AttentionMetadata.decode_order does), head-major dispatch; replays with new lengths match the
    reference, and padding rows (length 0) get zeros."""
    rng = torch.Generator().manual_seed(3)
    ctx = torch.randint(1, 1500, (40,), generator=rng).tolist()
    q, kc, vc, bt, _, sl = make_paged(ctx, [1] * 40, GPU_H, GPU_HK, GPU_D, 16, torch.bfloat16, "cuda")
    assert dl.wants_order(40, GPU_HK, q.device)
    scale = GPU_D**-0.5
    out = torch.empty_like(q)

    def step():
        order = dl.longest_first(sl)  # as AttentionMetadata.decode_order sorts
        paged_decode_attention(q, kc, vc, bt, sl, scale, out=out, num_splits=1, order=order)

    step()  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):
        lens = (torch.rand(40, generator=rng) * torch.tensor(ctx)).to(torch.int32)  # within each table
        lens[-3:] = 0
        _replay_matches(graph, lens, q, kc, vc, bt, sl, scale, out)


@gpu
def test_gpu_decode_in_cuda_graph():
    ctx = [100, 700, 1500, 3]
    q, kc, vc, bt, _, sl = make_paged(ctx, [1] * 4, GPU_H, GPU_HK, GPU_D, 16, torch.bfloat16, "cuda")
    scale = GPU_D**-0.5
    out = torch.empty_like(q)
    bound = bt.shape[1] * 16
    paged_decode_attention(q, kc, vc, bt, sl, scale, out=out, max_seq_len=bound)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_decode_attention(q, kc, vc, bt, sl, scale, out=out, max_seq_len=bound)
    for lens in ([100, 700, 1500, 3], [101, 1, 1400, 4], [0, 650, 1501, 16]):
        _replay_matches(graph, torch.tensor(lens, dtype=torch.int32), q, kc, vc, bt, sl, scale, out)


def _replay_matches(graph, lens, q, kc, vc, bt, sl, scale, out) -> None:
    """Replays a captured decode launch with new lengths and a new q: the live rows match the fp32
    reference, the padding rows (length 0) are zeros."""
    sl.copy_(lens)
    q.normal_()
    graph.replay()
    torch.cuda.synchronize()
    live = sl > 0
    expect = ref.decode_attention(*_fp32_args([q[live], kc, vc, bt[live], sl[live], scale]))
    assert max_err(out[live], expect) < GPU_ATOL[torch.bfloat16]
    assert torch.all(out[~live] == 0)
