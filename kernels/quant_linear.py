"""Weight-only quantized projections on the CPU (EngineConfig.quantization "int8" | "int4").

A decode step at a few rows reads every weight once: on the CPU it is bound by memory traffic, and
float32 weights are 4 (int8) to 7 (int4) times the bytes. Each projection's weight is quantized once at
load and its product runs on torch's own packed CPU kernels:
- int8: symmetric, one scale per output row; `aten._weight_int8pack_mm`, and from DYNAMIC_M rows an int8
  GEMM on x rounded to integers (`int8_gemm`: oneDNN's where the CPU has VNNI, else fbgemm's AVX2 one).
- int4: asymmetric, one (scale, zero) per output row and group of GROUP input columns;
  `aten._convert_weight_to_int4pack_for_cpu` packs it once, `aten._weight_int4pack_mm_for_cpu` multiplies.
Both kernels take bfloat16 activations and scales on their vectorized (AVX-512) path (float32 inputs fall
to a scalar loop ~10x slower), so x is rounded to bfloat16 on the way in and the product comes back in
x's dtype. Scales and zeros are rounded to bfloat16 before the weights are quantized against them, so the
weights the kernel sees are exactly `dequantize`'s.

int4 keeps a GGUF file's Q4_1 weights as they are: the converted float folder holds their exact
dequantization w = d * q + m per block of 32 (fp16 d and m, q in 0..15), and `q41_grid` recovers q, d
and m from it exactly (the block's min is m, (max - min) / 15 is d; the round trip is checked bit for
bit), so no weight is rounded again (a weight off that grid, e.g. one with a LoRA adapter merged into
it, is quantized from its min and max as before). d and m + 8d need more bits than bfloat16 holds: each
is split into a bfloat16 hi part and the bfloat16 of its remainder (lo), two scale sets over the one
packed q (W_hi + W_lo), and x likewise into hi and lo rows. `product` then sums x_hi W_hi + x_lo W_hi
(one call, 2M rows) and x_hi W_lo (a second call) in float32; what is left is the kernel's bfloat16
rounding of each output (2^-8 relative), which these kernels cannot hand back in float32. SPLIT_ENV
picks a cheaper variant for measurement (bench.cpu1). From WIDE_M rows (prefill chunks) the packed kernel
costs more than dequantizing: the weight is rebuilt in float32 from q kept two to a byte (N x K / 2 bytes
more; one loop compiled by torch.compile, the same bits as the eager form) and multiplied by x in float32,
x unrounded (the float32 path's exactness, not the kernel's).

The quantized form hangs on the Parameter itself (attribute QUANT) and its float storage is released
(the parameter keeps its shape as a zero-stride view, so shape checks and the module tree are
unchanged): `kernels.dispatch` looks the attribute up before any float product. The logits weight is
int8 in both modes; a tied embedding's lookup reads those int8 rows (`embedding`). Where the logits
weight is a GGUF Q8_0 tensor's exact dequantization (`q80_grid`, Q80_ENV), its exact rows (int8 q and
an fp16 d per block of 32) are kept beside the kernel's: the refined leading logits and the tied
lookup read them, so both are float32-exact; they cost V x H bytes more. float32 stays the default and
the exact path.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from dataclasses import dataclass

import torch

log = logging.getLogger("chatloom.kernels")

MODES = ("int8", "int4")
GROUP = 32  # int4: input columns sharing one (scale, zero)
REFINE_TOP = 32  # logits recomputed in float32 per row (QuantWeight.refine)
QUANT = "_chatloom_quant"  # the Parameter attribute holding its QuantWeight
ROWS = "_chatloom_rows"  # an embedding table's int8 rows for the lookup: (q (V, H), scale (V,) | (V, H / 32))
# "1": a logits weight on GGUF Q8_0's grid keeps its exact rows for the refine and the tied lookup
Q80_ENV = "CHATLOOM_Q80_ROWS"
# int4 on a Q4_1 grid: "both" (x and the scales split into bfloat16 hi + lo), "scales", "x", or "none"
SPLIT_ENV = "CHATLOOM_INT4_SPLIT"
SPLITS = ("both", "scales", "x", "none")
# int4 products of this many rows and more (prefill chunks, wide batches) dequantize the weight to float32
# and run one float32 GEMM: the packed kernel's cost grows with the rows (three times the rows where x and
# the scales are split), a GEMM's per row is a small fraction of a weight's dequantization
WIDE_M = 64
# int8 products of this many rows and more run as int4's wide ones where the int8 GEMM is fbgemm's
WIDE_INT8_M = 128
# int8 products of this many rows and more (C1's decode batches, prefill chunks) quantize x to integers and
# run an int8 GEMM (`int8_gemm`): the weight-only packed kernel costs about the same per row as for one row,
# the int8 GEMM a fraction of it from 8 rows (docs/performance.md)
DYNAMIC_M = 8
# the same on fbgemm's GEMM: its two passes overtake the packed kernel between 16 and 32 rows
# (bench.quant_products on the AVX2 EPYC); the logits' one pass from the first row (2-5x faster there)
FBGEMM_M = 32


@dataclass
class QuantWeight:
    mode: str  # "int8" | "int4"
    shape: tuple[int, int]  # (N, K) of the float weight
    data: torch.Tensor  # int8: (N, K) int8; int4: the packed uint8 of _convert_weight_to_int4pack_for_cpu
    scales: torch.Tensor  # int8: (N,) bf16; int4: (K / GROUP, N, 2) bf16 [scale, zero]
    nbytes: int  # what data and scales hold
    refine: int = 0  # int8: the largest outputs of each row recomputed in float32 (`product`)
    lo_scales: torch.Tensor | None = None  # int4 on a Q4_1 grid: (K / GROUP, N, 2) bf16 remainders (W_lo)
    split_x: bool = False  # int4 on a Q4_1 grid: x goes in as bfloat16 hi and lo rows
    rows: tuple[torch.Tensor, torch.Tensor] | None = None  # Q8_0 grid: q (N, K) int8, d (N, K / 32) fp16
    nibbles: torch.Tensor | None = None  # int4: (N, K / 2) uint8, q two to a byte, for wide products
    gemm_packed: object = None  # int8 on the "fbgemm" GEMM: its packed weight, built on first use


def quantize_int8(
    w: torch.Tensor, scale_dtype: torch.dtype = torch.bfloat16
) -> tuple[torch.Tensor, torch.Tensor]:
    """w (N, K) float -> (q (N, K) int8, scale (N,) scale_dtype); w ~ q * scale, |q| <= 127, per row.
    Weights keep bf16 scales (the packed kernel's); a product's x rows keep float32 ones (_int8_dynamic)."""
    w = w.detach().float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12).to(scale_dtype)
    q = torch.round(w / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def quantize_int4(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w (N, K) float -> (q (N, K) int32 in 0..15, scale (N, K / group) bf16, zero (N, K / group) bf16);
    w ~ (q - 8) * scale + zero (torch's int4 layout), the group's min and max as 0 and 15."""
    n, k = w.shape
    wg = w.detach().float().reshape(n, k // group, group)
    lo, hi = wg.amin(dim=-1), wg.amax(dim=-1)
    scale = ((hi - lo) / 15.0).clamp(min=1e-12).to(torch.bfloat16)
    zero = (lo + 8.0 * scale.float()).to(torch.bfloat16)
    q = torch.round((wg - zero.float()[..., None]) / scale.float()[..., None]) + 8
    return q.clamp(0, 15).to(torch.int32).reshape(n, k), scale, zero


def q41_grid(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(q (N, K) int32 in 0..15, d (N, K / GROUP) float32, m (N, K / GROUP) float32) with
    w == d * q + m exactly in float32 (GGUF Q4_1's dequantization, fp16 d and m), or None where some
    block of w is not on such a grid."""
    n, k = w.shape
    if k % GROUP:
        return None
    wg = w.detach().float().reshape(n, k // GROUP, GROUP)
    lo, hi = wg.amin(dim=-1), wg.amax(dim=-1)
    d = ((hi - lo) / 15.0).half().float()
    m = lo.half().float()
    q = torch.round((wg - m[..., None]) / torch.where(d == 0, 1.0, d)[..., None])
    if q.min() < 0 or q.max() > 15 or not torch.equal(d[..., None] * q + m[..., None], wg):
        return None
    return q.to(torch.int32).reshape(n, k), d, m


def q80_grid(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(q (N, K) int8, d (N, K / GROUP) float32) with w == d * q exactly (GGUF Q8_0's dequantization,
    fp16 d, |q| <= 127 and 127 in each block), or None where some block of w is off such a grid."""
    n, k = w.shape
    if k % GROUP:
        return None
    wg = w.detach().float().reshape(n, k // GROUP, GROUP)
    d = (wg.abs().amax(dim=-1) / 127.0).half().float()
    q = torch.round(wg / torch.where(d == 0, 1.0, d)[..., None])
    if q.abs().max() > 127 or not torch.equal(d[..., None] * q, wg):
        return None
    return q.to(torch.int8).reshape(n, k), d


def _block_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q (..., K) int8 with scale (...) per row or (..., K / GROUP) per block -> float32 rows (..., K)."""
    if scale.dim() == q.dim() - 1:
        return q.float() * scale.float()[..., None]
    shape = q.shape
    qg = q.reshape(*shape[:-1], shape[-1] // GROUP, GROUP).float()
    return (qg * scale.float()[..., None]).reshape(shape)


def _hi_lo(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """v (float32) -> (hi, lo) bfloat16 with hi + lo == v to 16 significant bits."""
    hi = v.to(torch.bfloat16)
    return hi, (v - hi.float()).to(torch.bfloat16)


def _int4_weight(q: torch.Tensor, sz: torch.Tensor) -> torch.Tensor:
    """(N, K) float32 of packed-layout q and (K / GROUP, N, 2) [scale, zero]: (q - 8) * scale + zero."""
    n, k = q.shape
    scale, zero = sz[..., 0].t().float(), sz[..., 1].t().float()  # (N, K / GROUP) each
    wg = (q.reshape(n, k // GROUP, GROUP).float() - 8) * scale[..., None] + zero[..., None]
    return wg.reshape(n, k)


def dequantize(qw: QuantWeight) -> torch.Tensor:
    """The (N, K) float32 weight the kernel multiplies by (the reference): W_hi + W_lo where split."""
    if qw.mode == "int8":
        return qw.data.float() * qw.scales.float()[:, None]
    q = _unpacked_int4(qw)
    w = _int4_weight(q, qw.scales)
    return w if qw.lo_scales is None else w + _int4_weight(q, qw.lo_scales)


def _unpacked_int4(qw: QuantWeight) -> torch.Tensor:
    """q (N, K) of an int4 weight, read back through the kernel (x = identity columns, scale 1, zero 8)."""
    n, k = qw.shape
    groups = k // GROUP
    ones = torch.ones(groups, n, 2, dtype=torch.bfloat16)
    ones[..., 1] = 8.0
    eye = torch.eye(k, dtype=torch.bfloat16)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, qw.data, GROUP, ones).t().round().to(torch.int32)


def quantize(w: torch.Tensor, mode: str, split: str | None = None) -> QuantWeight | None:
    """The QuantWeight of w (N, K), or None where the kernel takes no such shape (int4: K not a multiple
    of GROUP, or N not of 16). int4 keeps a Q4_1 grid exactly (`q41_grid`; split: SPLITS, default the
    SPLIT_ENV variable's, else "both")."""
    if mode not in MODES:
        raise ValueError(f"quantization must be one of {MODES}, got {mode!r}")
    n, k = w.shape
    if mode == "int8":
        q, scale = quantize_int8(w)
        return QuantWeight("int8", (n, k), q, scale, q.numel() + 2 * n)
    if k % GROUP or n % 16:
        return None
    split = split or os.environ.get(SPLIT_ENV, "both")
    if split not in SPLITS:
        raise ValueError(f"{SPLIT_ENV} must be one of {SPLITS}, got {split!r}")
    grid = q41_grid(w)
    lo_sz = None
    if grid is None:
        q, scale, zero = quantize_int4(w)
        sz = torch.stack([scale.t(), zero.t()], dim=-1).contiguous()  # (K / GROUP, N, 2)
    else:
        q, d, m = grid
        (s_hi, s_lo), (z_hi, z_lo) = _hi_lo(d), _hi_lo(m + 8.0 * d)  # w = (q - 8) * d + (m + 8d)
        sz = torch.stack([s_hi.t(), z_hi.t()], dim=-1).contiguous()
        if split in ("both", "scales"):
            lo_sz = torch.stack([s_lo.t(), z_lo.t()], dim=-1).contiguous()
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    nibbles = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)  # (N, K / 2)
    nbytes = packed.numel() + nibbles.numel() + sz.numel() * 2 * (1 if lo_sz is None else 2)
    split_x = grid is not None and split in ("both", "x")
    return QuantWeight("int4", (n, k), packed, sz, nbytes, lo_scales=lo_sz, split_x=split_x, nibbles=nibbles)


def product(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) @ dequantize(qw)^T + bias, on torch's packed kernels (int8 from DYNAMIC_M rows: its int8
    GEMM), in x's dtype."""
    route = _route(x, qw)
    if route == "dense":
        w = _dense_wide(qw) if qw.mode == "int4" else dequantize(qw)
        y = torch.nn.functional.linear(x.float(), w).to(x.dtype)
        return y if bias is None else y.add_(bias)
    if route == "gemm":
        y = _int8_dynamic(x, qw).to(x.dtype)
    else:
        xb = x.to(torch.bfloat16)  # both packed kernels' only fast input
        if qw.mode == "int8":
            y = torch.ops.aten._weight_int8pack_mm(xb, qw.data, qw.scales).to(x.dtype)
        elif qw.split_x or qw.lo_scales is not None:
            y = _int4_split(x, xb, qw)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, qw.data, GROUP, qw.scales).to(x.dtype)
    if qw.refine and qw.mode == "int8" and bias is None:
        # logits: the kernel's bfloat16 output steps by 1/8 at 16-32, which ties and swaps the leading
        # tokens; their values again in float32 from x and the dequantized rows
        # (from the exact Q8_0 rows where they were kept)
        top = y.topk(min(qw.refine, y.shape[1]), dim=1).indices  # (M, refine)
        q, scale = qw.rows if qw.rows is not None else (qw.data, qw.scales)
        rows = _block_rows(q[top], scale[top]).to(x.dtype)  # (M, refine, K)
        y.scatter_(1, top, torch.einsum("mk,mrk->mr", x, rows))
    return y if bias is None else y.add_(bias)


@functools.cache
def int8_gemm() -> str:
    """The int8 x int8 GEMM of wide int8 products on this CPU:
    - "int_mm": `torch._int_mm`, where the CPU has VNNI: oneDNN's kernel. x goes in rounded to int8 per
      row, and its rounding error again, rounded likewise (`_int8_split`): one GEMM over both parts' rows,
      x ~14 bits together (one part for the logits, as below). Without VNNI torch runs it as a scalar
      loop: 5-12x slower than the weight-only kernel and 11-48x slower than fbgemm's on the AVX2 EPYC
      (`bench.quant_products`, docs/performance.md).
    - "fbgemm": torch's x86 quantized engine (AVX2 kernels), which rounds x to 7 bits over the batch
      (`torch.quantize_per_tensor_dynamic`, reduce_range: 8-bit pairs would saturate AVX2's 16-bit sums).
      x goes in scaled per row to [-1, 1], and its rounding error again, scaled likewise (`_fbgemm_parts`):
      two GEMMs whose x together is ~14 bits, faster than the weight-only kernel from FBGEMM_M rows; the
      logits take one (`_x_passes`). Its packed weight is a second copy of q (N x K bytes).
    - "": neither (e.g. an ARM CPU): the weight-only kernel at every width."""
    if torch.cpu._is_vnni_supported():
        return "int_mm"
    engine = torch.backends.quantized.engine
    if engine in ("x86", "fbgemm") and hasattr(torch.ops.quantized, "linear_dynamic"):
        return "fbgemm"
    return ""


def _route(x: torch.Tensor, qw: QuantWeight) -> str:
    """How `product` multiplies x:
    - "dense": in float32 on the dequantized weight, x unrounded. int4 from WIDE_M rows (its packed
      kernel costs per row); int8 from WIDE_INT8_M where the int8 GEMM is fbgemm's (from 256 rows its two
      passes cost 1.3-2.2x float32's for 576 x 1536 and 0.7-0.9x for 1536 x 576, `bench.quant_products`
      on the AVX2 EPYC), not the logits, whose rows are the batch's sequences and which keep their refine.
    - "gemm": int8 on `int8_gemm`, x rounded to integers: from DYNAMIC_M rows, or on fbgemm's from
      FBGEMM_M (the logits from the first row).
    - "packed": torch's packed weight-only kernel, x rounded to bfloat16 (unless int4 splits it)."""
    m = x.shape[0]
    if qw.mode == "int4":
        return "dense" if qw.nibbles is not None and m >= WIDE_M else "packed"
    gemm = int8_gemm()
    if gemm == "fbgemm" and not qw.refine and m >= WIDE_INT8_M:
        return "dense"
    rows = DYNAMIC_M if gemm != "fbgemm" else 1 if qw.refine else FBGEMM_M
    return "gemm" if gemm and m >= rows and x.shape[1] % 8 == 0 else "packed"


def _fbgemm_parts(x: torch.Tensor, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """x (M, K) -> n (1 or 2) of (part (M, K) float32 with rows in [-1, 1], scale (M, 1)): the first part
    is x, the second the first's rounding error on the GEMM; x == sum(rounded part * scale) up to the
    last part's rounding."""
    s1 = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-30)
    x1 = x.float() / s1
    if n == 1:
        return [(x1, s1)]
    r = (x1 - _fbgemm_rounded(x1)).mul_(s1)
    s2 = r.abs().amax(dim=1, keepdim=True).clamp(min=1e-30)
    return [(x1, s1), (r.div_(s2), s2)]


def _x_passes(qw: QuantWeight) -> int:
    """How many parts x goes in as on either int8 GEMM: one for the logits (their leading values are
    recomputed in float32 from x itself, so the rounded x only picks which), two elsewhere."""
    return 1 if qw.refine else 2


def _fbgemm_rounded(xn: torch.Tensor) -> torch.Tensor:
    """xn as the fbgemm GEMM rounds it (7 bits over the whole tensor), in float32."""
    with warnings.catch_warnings():  # as in _fbgemm_weight
        warnings.simplefilter("ignore", UserWarning)
        return torch.quantize_per_tensor_dynamic(xn, torch.quint8, True).dequantize()


def _int8_dynamic(x: torch.Tensor, qw: QuantWeight, gemm: str | None = None) -> torch.Tensor:
    """x (M, K) @ (q * scale)^T with x rounded to integers on `int8_gemm` (or the named gemm): (M, N)
    float32."""
    if (gemm or int8_gemm()) == "fbgemm":
        parts = _fbgemm_parts(x, _x_passes(qw))
        ys = [torch.ops.quantized.linear_dynamic(p, _fbgemm_weight(qw), True).mul_(s) for p, s in parts]
        return ys[0] if len(ys) == 1 else ys[0].add_(ys[1])
    q, scales = _int8_split(x, _x_passes(qw))  # (P * M, K) int8, (P, M)
    acc = torch._int_mm(q, qw.data.t())  # (P * M, N) int32: both passes' rows in one call
    return _fused(_int8_sum, acc, scales, qw.scales.float())


def _int8_split(x: torch.Tensor, passes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> (q (passes * M, K) int8, scales (passes, M) float32): x rounded to int8 per row, then
    (two passes) its rounding error rounded likewise; x == sum over passes of q * scale up to the last
    one's rounding. Compiled (`_fused`): one loop instead of ~12 passes over (M, K) temporaries."""
    return _fused(_int8_two if passes == 2 else _int8_one, x.float())


def _int8_one(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q, s1 = quantize_int8(x, torch.float32)  # (M, K) int8, (M,)
    return q, s1[None]


def _int8_two(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q1, s1 = quantize_int8(x, torch.float32)
    # the first part's rounding error, |e| <= 1/2 in units of s1, rounded likewise
    q2, u = quantize_int8(x / s1[:, None] - q1, torch.float32)
    return torch.cat([q1, q2]), torch.stack([s1, s1 * u])


def _int8_sum(acc: torch.Tensor, scales: torch.Tensor, wscale: torch.Tensor) -> torch.Tensor:
    """(P * M, N) int32 sums, (P, M) x scales, (N,) weight scales -> (M, N) float32."""
    p, m = scales.shape
    return (acc.view(p, m, -1).float() * scales[..., None]).sum(0) * wscale


def _fbgemm_weight(qw: QuantWeight) -> object:
    """qw's weight packed for fbgemm's GEMM, on first use (the same q and scales, zero points 0)."""
    if qw.gemm_packed is None:
        with warnings.catch_warnings():  # torch marks quantized tensors deprecated; the ops are current
            warnings.simplefilter("ignore", UserWarning)
            zero = torch.zeros(qw.shape[0], dtype=torch.long)
            w = torch._make_per_channel_quantized_tensor(qw.data, qw.scales.double(), zero, 0)
            qw.gemm_packed = torch.ops.quantized.linear_prepack(w, None)
    return qw.gemm_packed


def _int8_dynamic_x(x: torch.Tensor, qw: QuantWeight) -> torch.Tensor:
    """x (M, K) as `_int8_dynamic` rounds it for qw, in float32 (the reference's x)."""
    if int8_gemm() == "fbgemm":
        parts = _fbgemm_parts(x, _x_passes(qw))
        return sum((_fbgemm_rounded(part) * s for part, s in parts), torch.zeros(()))
    q, scales = _int8_split(x, _x_passes(qw))
    return (q.view(*scales.shape, -1).float() * scales[..., None]).sum(0)


def _dense_int4(nibbles: torch.Tensor, scales: torch.Tensor, lo_scales: torch.Tensor | None) -> torch.Tensor:
    """dequantize's weight from the kept nibbles (N, K / 2): (N, K) float32, W_hi + W_lo where the scales
    are split. Pure tensor work, so torch.compile fuses its ~10 passes into one loop (_dense_wide)."""
    n = nibbles.shape[0]
    q = torch.stack([nibbles & 15, nibbles >> 4], dim=-1).reshape(n, -1)
    w = _int4_weight(q, scales)
    return w if lo_scales is None else w.add_(_int4_weight(q, lo_scales))


_compiled: dict = {}  # torch.compile's forms of `_fused`'s functions, built on first use
_compile_failed = False  # torch.compile could not build one here: the eager forms from then on


def _fused(fn, *args):
    """fn(*args) through torch.compile (inductor's C++ loops; on first use, a few seconds; sizes dynamic,
    so one program serves every row count), eager where torch.compile cannot build it. fn is pure
    tensor work whose fused loops keep its values (tests/kernels compare both forms)."""
    global _compile_failed
    if not _compile_failed:
        try:
            with warnings.catch_warnings():  # inductor's own use of deprecated torch.jit APIs while compiling
                warnings.simplefilter("ignore", DeprecationWarning)
                if fn not in _compiled:
                    _compiled[fn] = torch.compile(fn, dynamic=True)
                return _compiled[fn](*args)
        except Exception as e:  # e.g. no C++ compiler for inductor: the eager form gives the same values
            log.warning("%s stays eager (torch.compile failed: %s)", fn.__name__, str(e).splitlines()[0])
            _compile_failed = True
    return fn(*args)


def _dense_wide(qw: QuantWeight) -> torch.Tensor:
    """The float32 weight of a wide int4 product: _dense_int4 compiled ((q - 8) * scale is exact in
    float32, so fusing leaves the bits as they are)."""
    return _fused(_dense_int4, qw.nibbles, qw.scales, qw.lo_scales)


def _int4_split(x: torch.Tensor, xb: torch.Tensor, qw: QuantWeight) -> torch.Tensor:
    """x_hi W_hi [+ x_lo W_hi] [+ x_hi W_lo], summed in float32 (module docstring), in x's dtype."""
    mm = torch.ops.aten._weight_int4pack_mm_for_cpu
    m = x.shape[0]
    if qw.split_x:
        xl = (x.float() - xb.float()).to(torch.bfloat16)
        both = mm(torch.cat([xb, xl]), qw.data, GROUP, qw.scales).float()  # (2M, N): hi rows, lo rows
        y = both[:m].add_(both[m:])
    else:
        y = mm(xb, qw.data, GROUP, qw.scales).float()
    if qw.lo_scales is not None:
        y.add_(mm(xb, qw.data, GROUP, qw.lo_scales).float())
    return y.to(x.dtype)


def reference_product(x: torch.Tensor, qw: QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """product's value in float32 from the dequantized weight (what the tests compare against); x as
    the kernel gets it (rounded to int8 per row on the int8 GEMM, else to bfloat16 unless it is split)."""
    route = _route(x, qw)
    if route == "gemm":
        xr = _int8_dynamic_x(x, qw)
    else:
        xr = x.float() if qw.split_x or route == "dense" else x.to(torch.bfloat16).float()
    y = xr @ dequantize(qw).t()
    return (y if bias is None else y + bias.float()).to(x.dtype)


def quantized(weight: torch.Tensor) -> QuantWeight | None:
    return getattr(weight, QUANT, None)


def takes(x: torch.Tensor, weight: torch.Tensor) -> QuantWeight | None:
    """weight's QuantWeight where `product` takes x (a 2-D CPU batch), else None."""
    qw = getattr(weight, QUANT, None)
    if qw is None or x.device.type != "cpu" or x.dim() != 2 or x.shape[1] != qw.shape[1]:
        return None
    return qw


def embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """table[ids]: from the int8 rows where the table's float storage was released (`quantize_model`)."""
    rows = getattr(table, ROWS, None)
    if rows is None:
        return torch.nn.functional.embedding(ids, table)
    q, scale = rows
    return _block_rows(torch.nn.functional.embedding(ids, q), scale[ids]).to(table.dtype)


def _release(param: torch.Tensor) -> None:
    """Frees param's float storage; it keeps its shape (a zero-stride view of one element)."""
    param.data = torch.zeros((), dtype=param.dtype, device=param.device).expand(param.shape)


@torch.no_grad()
def quantize_model(model: torch.nn.Module, mode: str) -> dict:
    """Quantizes every decoder projection and the logits weight of a CPU model in place (see the module
    docstring); returns {"weights": how many, "float_bytes": released, "quant_bytes": held}."""
    if mode not in MODES:
        raise ValueError(f"quantization must be one of {MODES}, got {mode!r}")
    targets: list[torch.nn.Parameter] = [
        mod.weight
        for name, mod in model.named_modules()
        if isinstance(mod, torch.nn.Linear) and "layers." in name
    ]
    logits = model.logits_weight
    tied = getattr(model, "tie_word_embeddings", False)
    stats = {"weights": 0, "float_bytes": 0, "quant_bytes": 0}
    for w in [*targets, logits]:
        if w.device.type != "cpu" or w.dim() != 2:
            raise ValueError("quantization runs on the CPU (EngineConfig.device='cpu')")
        # the logits weight stays int8 under int4 (llama.cpp's files likewise keep the output layer at
        # more bits): its group-wise 4-bit error flipped most greedy tokens of SmolLM2 (docs/performance.md)
        qw = quantize(w, "int8" if w is logits else mode)
        if qw is None:
            continue
        if w is logits:
            qw.refine = REFINE_TOP
            if os.environ.get(Q80_ENV, "1") == "1":
                grid = q80_grid(w)
                qw.rows = None if grid is None else (grid[0], grid[1].half())
                qw.nbytes += 0 if qw.rows is None else qw.rows[0].numel() + qw.rows[1].numel() * 2
        if w is logits and tied:  # the embedding lookup reads the same int8 rows from now on
            setattr(w, ROWS, qw.rows or (qw.data, qw.scales))
        setattr(w, QUANT, qw)
        stats["weights"] += 1
        stats["float_bytes"] += w.numel() * w.element_size()
        stats["quant_bytes"] += qw.nbytes
        _release(w)
    _trim_heap()
    return stats


def _trim_heap() -> None:
    """Hands the released float weights' heap pages back to the system (glibc keeps freed heap memory
    for reuse otherwise, so the resident set would not shrink)."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL("libc.so.6").malloc_trim(0)
