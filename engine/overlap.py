"""A wide decode step as two micro-batches whose layers interleave on the GPU.

At batch 256 a W2 step spends ~78% of its time in the decode attention, which streams K/V from HBM,
and most of the rest in the layer tails (o_proj, norms, gate_up, SiLU, down, the next qkv): small
GEMMs bound by their launches and waves, not by HBM. Run one after the other, the two never share the
GPU. Here the batch's rows are cut in two halves that go through the layers on their own streams:
the attention launches of both halves queue on one stream (half A of layer L, half B of layer L, half
A of layer L + 1, ...), and each half's tail runs on its own higher-priority stream while the other
half's attention streams K/V, so the tails take their SMs as attention programs retire instead of
waiting for a whole launch to drain.

The halves compute exactly what the whole batch does, row by row (each row's attention reads only
its own sequence; the projections are per row), with the first layer's qkv and the final norm over
the whole batch. Captured inside the decode graphs (engine.cuda_graphs), where the streams' order
becomes the graph's edges. Off by default (OVERLAP_MIN_BATCH: measured slower on the H200).
"""

from __future__ import annotations

import torch

from engine.attention import AttentionMetadata

# Decode graphs of at least this many sequences run their forward as two interleaved halves (0: never).
# Off: on the H200 the halves do overlap, but the decode attention slows by about what the tails hide.
# W2 (one machine session): 23,479 tok/s with halves from batch 64, 22,448 with 64-key attention tiles
# (which leave room on an SM for a GEMM program), against 25,719 without. Traced at batch 256 (`chatloom
# bench --workload w2 --trace`): a half's attention launch took 88-106 us against ~84 (half of the whole
# batch's 168), the tails' kernels ran 2-3x longer beside it (RMSNorm 6-11 us against 2), and the step
# took 6,387 us against 6,062: the attention's K/V rate follows the SMs it holds.
OVERLAP_MIN_BATCH = 0


class OverlapStreams:
    """The side streams of an interleaved forward: one for the attention launches, one per half for its
    tails (higher priority: a tail's programs are dispatched before further attention programs)."""

    def __init__(self, device: torch.device) -> None:
        low, high = torch.cuda.Stream.priority_range()  # (least, greatest) priority: greatest is lowest
        self.attention = torch.cuda.Stream(device=device, priority=low)
        self.tails = (
            torch.cuda.Stream(device=device, priority=high),
            torch.cuda.Stream(device=device, priority=high),
        )


def overlaps(bs: int, device: torch.device) -> bool:
    """Whether a decode graph of bs sequences runs interleaved halves."""
    return device.type == "cuda" and OVERLAP_MIN_BATCH > 0 and bs >= OVERLAP_MIN_BATCH


def overlapped_forward(
    model,
    input_ids: torch.Tensor,  # (bs,)
    positions: torch.Tensor,  # (bs,)
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    meta: AttentionMetadata,  # decode-only
    final_norm: bool,
    streams: OverlapStreams | None,
):
    """model.forward for a decode-only batch, its layers run as two halves (see the module doc); without
    streams (CPU) the halves run one after the other, which checks the slicing."""
    bs = input_ids.shape[0]
    cut = bs // 2
    parts = [(0, cut), (cut, bs)]
    metas = [meta.decode_rows(lo, hi) for lo, hi in parts]
    pos = [positions[lo:hi] for lo, hi in parts]
    x, residual = model.layers[0].qkv(input_ids, model.embed_tokens.weight)  # the whole batch
    xs = [x[lo:hi] for lo, hi in parts]
    rs = [residual[lo:hi] for lo, hi in parts]
    keep = [x, residual]  # every intermediate lives until the halves join (no block reused across streams)
    main = torch.cuda.current_stream() if streams is not None else None
    if streams is not None:
        for s in (streams.attention, *streams.tails):
            s.wait_stream(main)
    for layer, kv, tail in zip(model.layers, kv_caches, model._tails(), strict=True):
        attn = layer.self_attn
        for p in range(2):
            if streams is None:
                a = attn.attend(xs[p], pos[p], model.cos_sin, kv, metas[p])
                xs[p], rs[p] = _tail(a, rs[p], tail)
                continue
            streams.attention.wait_stream(streams.tails[p])  # this half's qkv
            with torch.cuda.stream(streams.attention):
                a = attn.attend(xs[p], pos[p], model.cos_sin, kv, metas[p])
            streams.tails[p].wait_stream(streams.attention)
            with torch.cuda.stream(streams.tails[p]):
                xs[p], rs[p] = _tail(a, rs[p], tail)
            keep += [a, xs[p], rs[p]]
    if streams is not None:
        for s in streams.tails:
            main.wait_stream(s)
    x, residual = torch.cat(xs), torch.cat(rs)
    del keep
    if not final_norm:
        return x, residual
    x, _ = model.norm.forward_add(x, residual)
    return x


def _tail(a: torch.Tensor, residual: torch.Tensor, tail):
    from kernels import dispatch as ops

    return ops.decode_layer_tail(a, residual, tail)
