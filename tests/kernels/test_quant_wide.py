"""kernels.quant_linear's wide int4 products (WIDE_M rows and more): the weight dequantized from its kept
nibbles and one float32 GEMM, float32-exact where the packed kernel rounds each output to bfloat16."""

from __future__ import annotations

import torch

from kernels import quant_linear
from kernels.quant_linear import WIDE_M, dequantize, product, quantize
from tests.kernels.test_quant_linear import _q41_weight, _rand


def test_nibbles_hold_the_packed_weight():
    w, _ = _q41_weight(96, 6 * quant_linear.GROUP, seed=20)
    qw = quantize(w, "int4", split="both")
    assert qw.nibbles.shape == (96, 3 * quant_linear.GROUP) and qw.nibbles.dtype == torch.uint8
    assert torch.equal(quant_linear._dense_int4(qw.nibbles, qw.scales, qw.lo_scales), dequantize(qw))


def test_wide_product_is_float32_exact():
    w, _ = _q41_weight(160, 18 * quant_linear.GROUP, seed=21)
    b = _rand(160, seed=22)
    qw = quantize(w, "int4", split="both")
    x = _rand(WIDE_M + 3, w.shape[1], seed=23)
    got = product(x, qw, b)
    exact = x.double() @ w.double().t() + b.double()
    bound = 1e-5 * (x.double().abs() @ w.double().abs().t()) + 1e-6
    assert got.dtype == torch.float32 and ((got.double() - exact).abs() <= bound).all()
    narrow = product(x[: WIDE_M - 1], qw, b)  # the packed kernel: bfloat16 outputs
    assert ((narrow.double() - exact[: WIDE_M - 1]).abs() > bound[: WIDE_M - 1]).any()


def test_compiled_dequantization_gives_the_same_bits():
    """The wide products' weight comes from _dense_int4 compiled into one loop: bit for bit the eager
    form, split scales or not."""
    for split, seed in (("both", 30), ("none", 31)):
        w, _ = _q41_weight(64, 4 * quant_linear.GROUP, seed=seed)
        qw = quantize(w, "int4", split=split)
        assert torch.equal(
            quant_linear._dense_wide(qw), quant_linear._dense_int4(qw.nibbles, qw.scales, qw.lo_scales)
        )
    assert not quant_linear._compile_failed  # it compiled here (CI has the C++ compiler inductor needs)
