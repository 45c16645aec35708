"""The paged attention kernels with the ALiBi family's own slopes (models.alibi: BLOOM's and MPT's
rules at six heads, past a power of two) match kernels.reference in float32 (interpreter on the CPU):
multi-head (one KV head per query head, as BLOOM and MPT), block sizes 16 and 32, a fresh prompt, a
cached prefix, chunks that start and end inside a block, decodes beside them, split-K decode, and q as
the model passes it (a strided view of the fused qkv output)."""

from __future__ import annotations

import pytest
import torch

from kernels import reference as ref
from kernels.decode_attention import paged_decode_attention
from kernels.prefill_attention import paged_prefill_attention
from models.alibi import bloom_slopes, mpt_slopes
from tests.kernels.paged import ATOL, make_paged, max_err

H, D = 6, 16
SCALE = D**-0.5
SLOPES = {"bloom": bloom_slopes(H), "mpt": mpt_slopes(H)}

# (context lengths, new-token counts) of one prefill launch; the new tokens are each context's last
CASES = {
    "fresh": ([21, 40], [21, 40]),
    "cached_prefix": ([48, 70], [16, 6]),  # a cache hit of whole blocks, the rest computed
    "chunks_mid_block": ([45, 29, 77], [13, 9, 24]),  # chunk boundaries inside blocks
    "with_decodes": ([33, 60, 9], [1, 1, 9]),  # decode rows in a mixed step
}


def _strided_q(q: torch.Tensor) -> torch.Tensor:
    """q (t, H, D) as AlibiAttention hands it over: the q third of a (t, 3, H, D) qkv buffer."""
    buf = torch.randn(q.shape[0], 3, *q.shape[1:], dtype=q.dtype)
    buf[:, 0] = q
    return buf.unbind(1)[0]


@pytest.mark.parametrize("family", list(SLOPES))
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("case", list(CASES))
def test_prefill_alibi_matches_reference(family, block_size, case):
    ctx, qlens = CASES[case]
    q, kc, vc, bt, cu, sl = make_paged(ctx, qlens, H, H, D, block_size, torch.float32)
    q = _strided_q(q)
    slopes = SLOPES[family]
    out = paged_prefill_attention(q, kc, vc, bt, cu, sl, max(qlens), SCALE, None, slopes)
    want = ref.paged_attention(q, kc, vc, bt, cu, sl, SCALE, None, slopes)
    assert max_err(out, want) < ATOL[torch.float32]
    # the bias is there: without it the result is another one
    assert max_err(want, ref.paged_attention(q, kc, vc, bt, cu, sl, SCALE)) > 1e-2


@pytest.mark.parametrize("family", list(SLOPES))
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_alibi_matches_reference(family, block_size, num_splits):
    ctx = [1, 17, 64, 95]
    q, kc, vc, bt, _, sl = make_paged(ctx, [1] * len(ctx), H, H, D, block_size, torch.float32)
    q = _strided_q(q)
    slopes = SLOPES[family]
    out = paged_decode_attention(q, kc, vc, bt, sl, SCALE, None, slopes, num_splits=num_splits)
    want = ref.decode_attention(q, kc, vc, bt, sl, SCALE, None, slopes)
    assert max_err(out, want) < ATOL[torch.float32]
    # the decode reference agrees with the prefill one (a decode is a one-token prefill)
    cu = torch.arange(len(ctx) + 1, dtype=torch.int32)
    assert max_err(want, ref.paged_attention(q, kc, vc, bt, cu, sl, SCALE, None, slopes)) < 1e-5
