"""kernels.quant_linear: weight-only int8 / int4 projections on the CPU, against their torch reference
(the dequantized weight), and the engine with EngineConfig.quantization."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from kernels import dispatch, quant_linear
from kernels.quant_linear import GROUP, dequantize, product, quantize, reference_product
from models.tiny import build_checkpoint


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_int8_rows_round_trip():
    w = _rand(96, 64, seed=0)
    q, scale = quant_linear.quantize_int8(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.bfloat16 and q.abs().max() <= 127
    err = (q.float() * scale.float()[:, None] - w).abs()
    assert (err <= scale.float()[:, None] * 0.5 + 1e-6).all()  # half a step per row at most


def test_int4_groups_round_trip():
    w = _rand(32, 4 * GROUP, seed=1)
    qw = quantize(w, "int4")
    deq = dequantize(qw)
    step = (w.reshape(32, 4, GROUP).amax(-1) - w.reshape(32, 4, GROUP).amin(-1)) / 15  # (N, groups)
    err = (deq - w).reshape(32, 4, GROUP).abs().amax(-1)
    # half a step, plus the bf16 rounding of the scale and zero
    assert (err <= 0.5 * step * 1.02 + 0.02 * w.abs().max()).all()
    assert deq.shape == w.shape and not torch.equal(deq, w)


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("m", [1, 5, 16, quant_linear.WIDE_M + 3, quant_linear.WIDE_INT8_M + 3])
@pytest.mark.parametrize("with_bias", [False, True])
def test_product_matches_reference(mode, m, with_bias):
    w = _rand(192, 2 * GROUP * 3, seed=2)
    b = _rand(192, seed=3) if with_bias else None
    x = _rand(m, w.shape[1], seed=4)
    qw = quantize(w, mode)
    got, want = product(x, qw, b), reference_product(x, qw, b)
    assert got.dtype == torch.float32 and got.shape == (m, 192)
    # the packed kernels return bfloat16: one rounding of each output (2^-8 relative); the int8 GEMM's
    # rounding of x to int8 is in the reference
    assert (got - want).abs().max() <= 2**-7 * want.abs().max()
    # and the quantized product stays near the float one
    exact = x @ w.t() + (b if b is not None else 0)
    tol = 0.02 if mode == "int8" else 0.15
    assert (got - exact).norm() <= tol * exact.norm()


@pytest.mark.parametrize("gemm", ["int_mm", "fbgemm"])
def test_int8_gemms_match_their_rounding_of_x(monkeypatch, gemm):
    """Both int8 GEMMs on any host (int8_gemm picks one by the CPU): the product equals x as each rounds
    it times the dequantized weight; the second pass (x's rounding error) makes x ~14 bits, the logits'
    single pass 7 (fbgemm) or 8 (`_int_mm`)."""
    if gemm == "fbgemm" and torch.backends.quantized.engine not in ("x86", "fbgemm"):
        pytest.skip("torch's x86 quantized engine is not this CPU's")
    monkeypatch.setattr(quant_linear, "int8_gemm", lambda: gemm)
    w, x = _rand(192, 256, seed=6), _rand(16, 256, seed=7) * torch.linspace(0.01, 10, 16)[:, None]
    qw = quantize(w, "int8")
    exact = x @ dequantize(qw).t()
    errs = []
    for refine in (0, quant_linear.REFINE_TOP):  # a projection, then the logits
        qw.refine = refine
        got = quant_linear._int8_dynamic(x, qw)
        want = quant_linear._int8_dynamic_x(x, qw) @ dequantize(qw).t()
        assert (got - want).abs().max() <= 1e-4 * want.abs().max()
        # every row keeps its own relative precision, whatever its scale
        errs.append(((got - exact).norm(dim=1) / exact.norm(dim=1)).max().item())
    assert errs[0] < 1e-3 and errs[1] < (0.03 if gemm == "fbgemm" else 0.01) and errs[0] < errs[1] / 10


def test_int8_parts_compiled_equal_eager():
    """x's int8 parts as torch.compile fuses them (`_fused`, one program for every row count) equal the
    eager functions' bit for bit, at two row counts."""
    for rows in (37, 5):
        x = _rand(rows, 256, seed=8) * torch.linspace(0.01, 10, rows)[:, None]
        for fn in (quant_linear._int8_one, quant_linear._int8_two):
            q, scales = quant_linear._fused(fn, x)
            q0, scales0 = fn(x)
            assert q.shape == (scales.shape[0] * rows, 256) and torch.equal(q, q0)
            assert torch.equal(scales, scales0)
    assert not quant_linear._compile_failed  # it compiled here (CI has the C++ compiler inductor needs)


def test_int4_refuses_shapes_the_kernel_does_not_take():
    assert quantize(_rand(64, GROUP + 8, seed=0), "int4") is None
    assert quantize(_rand(24, 2 * GROUP, seed=0), "int4") is None
    with pytest.raises(ValueError, match="quantization must be one of"):
        quantize(_rand(16, 32, seed=0), "int3")


def test_dispatch_takes_a_quantized_weight_and_releases_its_floats():
    layer = torch.nn.Linear(2 * GROUP, 64)
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.ModuleDict({"proj": layer})])
    model.embed = torch.nn.Embedding(128, 2 * GROUP)
    model.logits_weight = model.embed.weight
    model.tie_word_embeddings = True
    x = _rand(3, 2 * GROUP, seed=5)
    with torch.no_grad():
        table = model.embed.weight.detach().clone()
        stats = quant_linear.quantize_model(model, "int4")
    assert stats["weights"] == 2 and stats["quant_bytes"] < stats["float_bytes"] / 2
    w = layer.weight
    assert w.shape == (64, 2 * GROUP) and w.stride() == (0, 0)  # the float storage is gone
    with torch.inference_mode():
        got = dispatch.linear(x, w, layer.bias)
        want = reference_product(x, quant_linear.quantized(w), layer.bias)
        assert (got - want).abs().max() <= 2**-7 * want.abs().max()
        ids = torch.tensor([0, 7, 127])
        rows = quant_linear.embedding(ids, model.embed.weight)  # int8 rows of the tied table
        assert (rows - table[ids]).abs().max() <= table.abs().max() / 127
        assert dispatch.lm_head(x, model.logits_weight).shape == (3, 128)


def test_config_validates_quantization():
    with pytest.raises(ValueError, match="quantization must be one of"):
        EngineConfig(model="m", quantization="fp8")
    with pytest.raises(ValueError, match="CPU only"):
        EngineConfig(model="m", quantization="int8", device="cuda")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    shape = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, max_position_embeddings=512, rms_norm_eps=1e-6,
                 tie_word_embeddings=True, initializer_range=0.1)  # fmt: skip
    return build_checkpoint(tmp_path_factory.mktemp("q"), "llama", vocab_size=512, shape=shape)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_engine_generates_with_quantized_weights(tiny, mode):
    """Every request completes on quantized weights; with int8 the first greedy token of each prompt
    matches float32's on most prompts (a random tiny model's logits are too flat for int4's error to
    keep its argmax: the real model's agreement is bench.cpu1's printout)."""
    prompts = [[(7 * i + 3 * j) % 500 + 1 for j in range(12 + i)] for i in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    ref = LLM(str(tiny), device="cpu", dtype="float32", num_kv_blocks=64).generate(prompts, params)
    # eager decode steps: the compiled step has its own tests (tests/runner/test_cpu_step.py)
    llm = LLM(str(tiny), device="cpu", dtype="float32", num_kv_blocks=64, quantization=mode,
              cpu_compile=False)  # fmt: skip
    model = llm.core.runner.model
    assert quant_linear.quantized(model.layers[0].mlp.down_proj.weight).mode == mode
    outs = llm.generate(prompts, params)
    assert all(len(o.outputs[0].token_ids) == 6 for o in outs)
    first = sum(
        a.outputs[0].token_ids[0] == b.outputs[0].token_ids[0] for a, b in zip(ref, outs, strict=True)
    )
    if mode == "int8":
        assert first >= 7


def test_refined_logits_are_float32_exact_where_they_lead():
    w = _rand(4096, 64, seed=6) * 3
    x = _rand(2, 64, seed=7) * 3
    qw = quantize(w, "int8")
    plain = product(x, qw)
    qw.refine = 8
    got = product(x, qw)
    exact = x @ dequantize(qw).t()
    top = exact.topk(8, dim=1).indices
    assert torch.allclose(got.gather(1, top), exact.gather(1, top), rtol=1e-6, atol=1e-5)
    assert (plain.gather(1, top) - exact.gather(1, top)).abs().max() > 1e-3  # bf16 output steps
    assert torch.equal(got.argmax(1), exact.argmax(1))


def _q41_weight(n, k, seed):
    """A weight on GGUF Q4_1's grid: per block of GROUP, fp16 d and m, w = d * q + m with q in 0..15
    (each block holds a 0 and a 15, as the quantizer's min and max), in float32 as gguf dequantizes."""
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // GROUP, generator=g) * 0.02 + 1e-3).half().float()
    m = (-torch.rand(n, k // GROUP, generator=g) * 0.15).half().float()
    q = torch.randint(0, 16, (n, k // GROUP, GROUP), generator=g)
    q[..., 3], q[..., 17] = 0, 15
    return (d[..., None] * q.float() + m[..., None]).reshape(n, k), q.reshape(n, k)


def test_q41_grid_recovers_the_blocks_exactly():
    w, q = _q41_weight(64, 4 * GROUP, seed=8)
    got_q, d, m = quant_linear.q41_grid(w)
    assert torch.equal(got_q, q.to(torch.int32))
    assert torch.equal((d[..., None] * got_q.reshape(64, 4, GROUP).float() + m[..., None]).reshape(64, -1), w)
    assert quant_linear.q41_grid(w + 1e-4 * _rand(*w.shape, seed=9)) is None  # off the grid
    assert quant_linear.q41_grid(_rand(64, 4 * GROUP, seed=9)) is None


def test_int4_keeps_a_q41_weight_exactly():
    w, _ = _q41_weight(96, 6 * GROUP, seed=10)
    qw = quantize(w, "int4", split="both")
    assert qw.lo_scales is not None and qw.split_x
    # W_hi + W_lo: d exactly (fp16 fits two bfloat16 parts), m + 8d to 16 bits
    assert (dequantize(qw) - w).abs().max() <= 1e-5 * w.abs().max()
    hi_only = quantize(w, "int4", split="x")
    assert hi_only.lo_scales is None and (dequantize(hi_only) - w).abs().max() > 1e-4 * w.abs().max()


@pytest.mark.parametrize("m", [1, 4, 19])
def test_split_int4_product_matches_float32_up_to_the_output_rounding(m):
    """x_hi W_hi + x_lo W_hi + x_hi W_lo reproduce x @ w^T of the Q4_1 weight in float32 to ~1e-5 of
    sum |x| |w|, beside the kernel's bfloat16 rounding of each output (2^-8 relative), which stays; the
    unsplit product's bfloat16 x and scales miss that bound."""
    w, _ = _q41_weight(160, 18 * GROUP, seed=11)
    x = _rand(m, w.shape[1], seed=12)
    exact = x.double() @ w.double().t()
    tol = 2**-8 * exact.abs() * 1.01 + 1e-5 * (x.double().abs() @ w.double().abs().t())
    got = product(x, quantize(w, "int4", split="both"))
    assert got.dtype == torch.float32 and ((got.double() - exact).abs() <= tol).all()
    plain = product(x, quantize(w, "int4", split="none"))
    assert ((plain.double() - exact).abs() > tol).float().mean() > 0.2


def _q80_weight(n, k, seed):
    """A weight on GGUF Q8_0's grid: per block of GROUP, fp16 d and int8 q (127 in each block)."""
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // GROUP, generator=g) * 0.01 + 1e-3).half().float()
    q = torch.randint(-127, 128, (n, k // GROUP, GROUP), generator=g)
    q[..., 5] = 127
    return (d[..., None] * q.float()).reshape(n, k)


def test_q80_logits_keep_their_exact_rows_for_the_refine_and_the_lookup(monkeypatch):
    monkeypatch.setenv(quant_linear.Q80_ENV, "1")
    w = _q80_weight(1024, 4 * GROUP, seed=13)
    q, d = quant_linear.q80_grid(w)
    assert torch.equal((q.reshape(1024, 4, GROUP).float() * d[..., None]).reshape(1024, -1), w)
    assert quant_linear.q80_grid(w + 1e-5) is None
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList()
    model.embed = torch.nn.Embedding(1024, 4 * GROUP)
    with torch.no_grad():
        model.embed.weight.copy_(w)
        model.logits_weight = model.embed.weight
        model.tie_word_embeddings = True
        quant_linear.quantize_model(model, "int8")
    qw = quant_linear.quantized(model.logits_weight)
    assert qw.rows is not None and qw.nbytes > 2 * w.numel()  # the per-row int8 data and the exact rows
    ids = torch.tensor([0, 9, 1023])
    assert torch.equal(quant_linear.embedding(ids, model.embed.weight), w[ids])  # exact, not re-rounded
    x = _rand(3, 4 * GROUP, seed=14)
    got, exact = product(x, qw), x @ w.t()
    top = exact.topk(8, dim=1).indices
    assert torch.allclose(got.gather(1, top), exact.gather(1, top), rtol=1e-6, atol=1e-6)
    assert qw.refine >= 8 and torch.equal(got.argmax(1), exact.argmax(1))
