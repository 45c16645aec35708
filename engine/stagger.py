"""A wide decode batch as two halves on two CUDA streams, their attentions taking turns.

At a wide batch a decode layer is a long attention launch bound by the K/V reads and a layer tail
(four projections, norms, SiLU) that leaves most SMs idle between its short launches. With the batch
cut in two, half B's attention reads K/V while half A runs its tail, and the other way round: the
attentions run one after the other (A, B, A, B, ...), each half's tail hides behind the other half's
attention. Each half's rows are computed as they would be alone, so the result is the batch's.
"""

from __future__ import annotations

import dataclasses

import torch

from engine.attention import AttentionMetadata
from kernels import dispatch as ops

# decode graphs of at least this many sequences run as two staggered halves (0: never). Each half
# must fill the SMs with unsplit attention programs (kernels.paged_attention.choose_num_splits), so
# the halves share no split-merge counters.
MIN_BATCH = 64
# "chain": each attention launch waits for the other half's previous one (A0, B0, A1, B1, ...);
# "free": the halves only start apart (B's first attention after A's) and then run as they go;
# "priority": as "chain", each half's tail on a stream of higher priority than the attentions'
ORDER = "chain"


def cut(batch: int, num_kv_heads: int, num_sms: int) -> int:
    """Where the batch is cut (half A = rows [0, cut)), or 0 for one pass."""
    if MIN_BATCH <= 0 or batch < MIN_BATCH:
        return 0
    half = batch // 2
    if (batch - half) * num_kv_heads < num_sms or half * num_kv_heads < num_sms:
        return 0
    return half


_STREAMS: dict = {}


def _tail_streams(device: torch.device) -> list[torch.cuda.Stream]:
    if device not in _STREAMS:
        high = torch.cuda.Stream.priority_range()[1]
        _STREAMS[device] = [torch.cuda.Stream(device, priority=high) for _ in range(2)]
    return _STREAMS[device]


def _half(meta: AttentionMetadata, rows: slice) -> AttentionMetadata:
    """A decode-only step's metadata for the rows of one half."""
    return dataclasses.replace(
        meta,
        slot_mapping=meta.slot_mapping[rows],
        num_decodes=len(range(*rows.indices(meta.num_decodes))),
        decode_block_tables=meta.decode_block_tables[rows],
        decode_seq_lens=meta.decode_seq_lens[rows],
    )


def staggered_forward(
    model,
    input_ids: torch.Tensor,  # (batch,)
    positions: torch.Tensor,  # (batch,)
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    meta: AttentionMetadata,  # decode only
    at: int,  # half A = rows [0, at), half B the rest
    side: torch.cuda.Stream,
    final_norm: bool = True,
):
    """model.forward of a decode-only batch, half A on the current stream and half B on `side`
    (capturable: `side` joins the capture and is joined back at the end)."""
    main = torch.cuda.current_stream()
    side.wait_stream(main)
    halves = [(slice(0, at), main), (slice(at, input_ids.shape[0]), side)]
    metas = [_half(meta, rows) for rows, _ in halves]
    emb = model.embed_tokens.weight
    state = []
    for rows, stream in halves:
        with torch.cuda.stream(stream):
            state.append(model.layers[0].qkv(input_ids[rows], emb))
    tails = _tail_streams(main.device) if ORDER == "priority" else [s for _, s in halves]
    for t in tails:
        t.wait_stream(main)
    turn = None  # the event after the attention launched last
    for li, (layer, kv, tail) in enumerate(zip(model.layers, kv_caches, model._tails(), strict=True)):
        for h, (rows, stream) in enumerate(halves):
            with torch.cuda.stream(stream):
                if turn is not None and (ORDER != "free" or li == 0):
                    stream.wait_event(turn)
                if tails[h] is not stream:
                    stream.wait_stream(tails[h])
                x, residual = state[h]
                a = layer.self_attn.attend(x, positions[rows], model.cos_sin, kv, metas[h])
                turn = torch.cuda.Event()
                turn.record(stream)
            with torch.cuda.stream(tails[h]):
                tails[h].wait_event(turn)
                state[h] = ops.decode_layer_tail(a, residual, tail)
    for t in tails:
        main.wait_stream(t)
    main.wait_stream(side)
    for t in state[1]:
        t.record_stream(main)
    x = torch.cat([state[0][0], state[1][0]])
    residual = torch.cat([state[0][1], state[1][1]])
    if not final_norm:
        return x, residual
    x, _ = model.norm.forward_add(x, residual)
    return x
