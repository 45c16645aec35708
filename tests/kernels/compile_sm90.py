"""Compile every kernel, at the GPU tile sizes its launcher picks, for sm_90 (H100/H200) without a GPU.

`python -m tests.kernels.compile_sm90 [--shard I/N]` prints one line per compiled kernel and exits 1 on a
failure or a register spill in an attention kernel (a shard compiles every N-th launch; shard 0 also
the Gluon tail).
It must run in a process where triton was imported WITHOUT TRITON_INTERPRET (triton's own library
functions are then compilable), hence subprocesses in test_compile_sm90.py."""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from kernels import reference as ref
from kernels._jit import record_launches
from tests.kernels.paged import alibi_slopes, make_paged

SPILL_TOLERANCE = 16  # bytes of stack per thread

NV_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")

TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32",
         torch.int64: "i64"}  # fmt: skip


def _launches(dtype: torch.dtype):
    from kernels import prefill_attention as pf
    from kernels.activation import silu_and_mul
    from kernels.bitmask import apply_token_bitmask_
    from kernels.decode_attention import paged_decode_attention
    from kernels.decode_launch import NewTokenQK
    from kernels.kv_cache import store_kv
    from kernels.order import longest_first
    from kernels.prefill_attention import paged_prefill_attention
    from kernels.qk_norm_rope import qk_norm_rope_store_kv
    from kernels.rmsnorm import fused_add_rms_norm, rms_norm
    from kernels.rope import apply_rope

    q, kc, vc, bt, cu, sl = make_paged([300, 64], [100, 1], 16, 8, 128, 16, dtype)
    with record_launches() as launches:
        for window, slopes in ((None, None), (64, alibi_slopes(16))):
            for splits in (1, 4):
                paged_prefill_attention(q, kc, vc, bt, cu, sl, 100, 0.1, window, slopes, num_splits=splits)
            for splits in (1, 16):
                paged_decode_attention(q[:2], kc, vc, bt, sl, 0.1, window, slopes, num_splits=splits)
            tiles = torch.from_numpy(pf.prefill_tile_map(np.array([100, 1]), 64, 6))  # as runner.batch_graphs
            paged_prefill_attention(q, kc, vc, bt, cu, sl, 1, 0.1, window, slopes, tile_map=tiles)
        if dtype != torch.float32:
            k = torch.randn(5, 8, 128).to(dtype)
            store_kv(k, k, kc, vc, torch.arange(5))
            x, w = torch.randn(4, 1024).to(dtype), torch.randn(1024).to(dtype)
            rms_norm(x, w, 1e-6)
            fused_add_rms_norm(x, x.clone(), w, 1e-6)
            cos_sin = ref.rope_cos_sin(torch.rand(64), 16)
            q4, k4 = torch.randn(4, 16, 128).to(dtype), torch.randn(4, 8, 128).to(dtype)
            apply_rope(q4, k4, torch.arange(4), cos_sin)
            silu_and_mul(torch.randn(4, 6144).to(dtype))
            silu_and_mul(torch.randn(4, 6144).to(dtype), row_scale=(x, 1e-6))  # folded norms' wide tail
            longest_first(torch.randint(0, 99, (200,), dtype=torch.int32))
            qkv = torch.randn(4, 32, 128).to(dtype)
            qk_norm_rope_store_kv(
                qkv[:, :16], qkv[:, 16:24], qkv[:, 24:], w[:128], w[:128], 1e-6, torch.arange(4),
                torch.randn(16, 128), kc, vc, torch.arange(4),
            )  # fmt: skip
            for splits in (1, 16):  # the fused decode launch: q/k norm, RoPE, K/V store, attention
                new = NewTokenQK(
                    qkv[:2, 16:24], qkv[:2, 24:], w[:128], w[:128], 1e-6, torch.arange(2),
                    torch.randn(16, 128), torch.arange(2),
                )  # fmt: skip
                paged_decode_attention(qkv[:2, :16], kc, vc, bt, sl, 0.1, new_token=new, num_splits=splits)
            # the wide batch of a model with folded norms: q/k/v times 1 / rms of the residual's row first
            folded = NewTokenQK(qkv[:2, 16:24], qkv[:2, 24:], w[:128], w[:128], 1e-6, torch.arange(2),
                                torch.randn(16, 128), torch.arange(2), x[:2], 1e-6)  # fmt: skip
            paged_decode_attention(qkv[:2, :16], kc, vc, bt, sl, 0.1, new_token=folded, num_splits=1)
            # a table wider than TABLE_REGS_MAX (graphs of a 40,960-token max_model_len): part of it held
            wide_bt = torch.zeros((2, 2560), dtype=torch.int32)
            wide_bt[:, : bt.shape[1]] = bt[:2]
            paged_decode_attention(qkv[:2, :16], kc, vc, wide_bt, sl, 0.1, new_token=folded, num_splits=1)
            one = NewTokenQK(qkv[:1, 16:24], qkv[:1, 24:], w[:128], w[:128], 1e-6, torch.arange(1),
                             torch.randn(16, 128), torch.arange(1))  # fmt: skip
            # batch 1: launched with programmatic dependent launch (kernels.pdl)
            paged_decode_attention(qkv[:1, :16], kc, vc, bt[:1], sl[:1], 0.1, new_token=one, num_splits=16)
            # after kernels.qkv_new_token, which releases it: programmatic dependent launch at any batch
            paged_decode_attention(qkv[:2, :16], kc, vc, bt, sl, 0.1, num_splits=1, after_release=True)
            from kernels import qkv_new_token as qnt

            wqkv = torch.randn(32 * 128, 1024).to(dtype)
            cs16 = torch.randn(16, 128)
            # the wide folded steps' qkv with the new token's work: TMA tiles where x's rows are aligned,
            # the pointer tiles for a view at an odd offset
            for m, aligned in ((200, True), (200, False)):
                flat = torch.randn(m * 1024 + 1).to(dtype)
                xm = flat[:-1].view(m, 1024) if aligned else flat[1:].view(m, 1024)
                qnt.qkv_new_token(xm, wqkv, 16, 8, w[:128], w[:128], 1e-6, 1e-6, torch.arange(m), cs16,
                                  kc, vc, torch.arange(m))  # fmt: skip
            from kernels.gemv import gemv
            from kernels.gemv_norm import add_rms_norm_gemv

            h1, wq = torch.randn(1, 1024).to(dtype), torch.randn(4096, 1024).to(dtype)
            for res in (None, h1.clone()):  # the decode GEMVs at M = 1, the norm folded in or not
                add_rms_norm_gemv(h1, res, w, 1e-6, wq)
            gemv(torch.randn(1, 6144).to(dtype), torch.randn(1024, 3072).to(dtype), silu_mul=True)
            from kernels.decode_tail import decode_layer_tail
            from kernels.reference import TailWeights

            r = lambda *shape: torch.randn(*shape).to(dtype)
            for m, has_next, b in ((1, True, None), (1, False, None), (1, True, r(6144))):  # one launch
                nxt = (w, 1e-6, r(4096, 1024), None) if has_next else (None, 1e-6, None, None)
                tw = TailWeights(r(1024, 2048), None, w, 1e-6, r(6144, 1024), b, r(1024, 3072), None, *nxt)
                decode_layer_tail(r(m, 2048), r(m, 1024), tw)
            apply_token_bitmask_(torch.randn(4, 1000), torch.zeros(4, 32, dtype=torch.int32), torch.arange(2))
            from kernels.sampling import sample_tokens

            lg, mask = torch.randn(4, 5000), torch.zeros(3, 160, dtype=torch.int32)
            sample_tokens(lg, torch.zeros(4), 7)  # the fused sampler, with the in-kernel row reduction
            sample_tokens(lg, torch.zeros(4), 7, mask=mask, mask_rows=torch.zeros(4, dtype=torch.int32))
            seed = torch.tensor([7])  # the sampler graphs' variant: the seed read on the device
            sample_tokens(lg, torch.zeros(4), seed, mask=mask, mask_rows=torch.zeros(4, dtype=torch.int32))
            from kernels.lm_head_sample import lm_head_sample

            hidden, head = torch.randn(1, 1024).to(dtype), torch.randn(4096, 1024).to(dtype)
            lm_head_sample(hidden, head, torch.zeros(1), torch.tensor([7]))
            # a step graph's end at batch 1: the final norm fused
            seed = torch.tensor([7])
            lm_head_sample(hidden, head, torch.zeros(1), seed, residual=hidden, norm=(w, 1e-6))
            # ... ending the step: the seed advanced and the tokens published (the engine's launch)
            ring = torch.zeros((4, 8), dtype=torch.int64)
            lm_head_sample(hidden, head, torch.zeros(1), seed, residual=hidden, norm=(w, 1e-6),
                           advance_seed=True, publish=(ring, seed))  # fmt: skip
            from kernels.gemv_norm import embed_rms_norm_gemv

            # the batch-1 head: the embedding gathered, launched with PDL, its weights read before the wait
            embed_rms_norm_gemv(torch.zeros(1, dtype=torch.int64), torch.randn(64, 1024).to(dtype), w, 1e-6,
                                r(4096, 1024), pdl_on=True)  # fmt: skip
            from kernels.publish import publish_tokens

            publish_tokens(torch.zeros(4, dtype=torch.int64), torch.zeros((4, 8), dtype=torch.int64), seed)
            from kernels.step_inputs import decode_step_inputs, mapped_step_inputs

            ring64 = torch.zeros((4, 36), dtype=torch.int64)
            ring32 = torch.zeros((4, 8 + 8 * 256), dtype=torch.int32)
            mapped_step_inputs(ring64, ring32, seed, torch.zeros(44, dtype=torch.int64),
                               torch.zeros(8, dtype=torch.int32), torch.zeros((8, 256), dtype=torch.int32),
                               torch.zeros(8, dtype=torch.int64), 4)  # fmt: skip

            table, tokens = torch.zeros((8, 256), dtype=torch.int32), torch.zeros(8, dtype=torch.int64)
            packed = torch.zeros(8 + 8 * 256, dtype=torch.int32)
            decode_step_inputs(torch.zeros(44, dtype=torch.int64), packed, table, tokens, 4)
    return launches


def _compile(fn, args, kwargs):
    """What JITFunction.run would compile for these arguments (16-byte alignment assumed, as torch gives)."""
    jf = JITFunction(fn)
    signature, constexprs, attrs, options = _signature(jf, args, kwargs)
    src = ASTSource(jf, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile_gluon(fn, args, kwargs):
    """A Gluon kernel compiled for sm_90 as its launch would (tensor descriptors typed by their blocks)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    signature, constexprs, attrs, options = _signature(fn, args, kwargs)
    src = GluonASTSource(fn, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def _signature(jf, args, kwargs):
    """(signature, constexprs, specialization attributes, compile options) of a launch."""
    kwargs = dict(kwargs)
    option_names = ("num_warps", "num_stages", "launch_cooperative_grid", "launch_pdl")
    options = {k: kwargs.pop(k) for k in option_names if k in kwargs}
    values = dict(zip(jf.arg_names, args, strict=False)) | kwargs
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(jf.arg_names):
        v = values[name]
        if jf.params[i].is_constexpr:
            signature[name], constexprs[name] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            signature[name] = "*" + TYPES[v.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, int):
            signature[name] = "i32" if abs(v) < 2**31 else "i64"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, float):
            signature[name] = "fp32"
        else:  # a host tensor descriptor
            signature[name] = _descriptor_type(v)
    return signature, constexprs, attrs, options


def _descriptor_type(desc) -> str:
    """A host tensor descriptor's type as the launcher names it (newer Triton asks the descriptor)."""
    if hasattr(desc, "__mangle__"):
        return desc.__mangle__()
    block = ",".join(str(d) for d in desc.block_shape)
    if not hasattr(desc, "layout"):  # a Triton (not Gluon) descriptor
        return f"tensordesc<{TYPES[desc.base.dtype]}[{block}]>"
    return f"tensordesc<{TYPES[desc.base.dtype]}[{block}],{desc.layout!r}>"


def _pdl_check(compiled, kwargs) -> tuple[bool, str]:
    """(ok, note): a launch asking for programmatic dependent launch (kernels.pdl: PDL=True) has both grid
    dependency instructions and the launch attribute; one only letting its successor start (RELEASE=True)
    has the release alone; one asking for neither has none."""
    want, release = bool(kwargs.get("PDL", False)), bool(kwargs.get("RELEASE", False))
    ptx = compiled.asm["ptx"]
    has = ("griddepcontrol.wait" in ptx, "griddepcontrol.launch_dependents" in ptx)
    has += (compiled.metadata.launch_pdl,)
    expect = (True, True, True) if want else (False, release, False)
    if has == expect:
        return True, " pdl" if want else (" release" if release else "")
    return False, f" PDL={want} RELEASE={release} but (wait, launch_dependents, launch attribute) = {has}"


def _release_after_wait(compiled, kwargs) -> bool:
    """The first launch after a step's input launch (the gathered head GEMV) lets its successor start only
    after its own wait: the decode attention after it reads the step's inputs before its wait
    (kernels.pdl). True for every other launch."""
    if not (kwargs.get("GATHER") and kwargs.get("PDL")):
        return True
    ptx = compiled.asm["ptx"]
    wait, release = ptx.find("griddepcontrol.wait"), ptx.find("griddepcontrol.launch_dependents")
    return 0 <= wait < release


def _resources(cubin: bytes, tmp: Path) -> tuple[int | None, int | None]:
    """(spilled bytes per thread, registers per thread), from cuobjdump (None where it is not available).
    Printed per kernel: whether a decode attention program fits beside a layer-tail program on an SM
    (kernels.decode_tail_tma's TmaPlan.alias) depends on both kernels' registers and shared memory."""
    cuobjdump = os.path.join(NV_BIN, "cuobjdump")
    if not shutil.which(cuobjdump):
        return None, None
    path = tmp / "k.cubin"
    path.write_bytes(cubin)
    done = subprocess.run([cuobjdump, "--dump-resource-usage", str(path)], capture_output=True, text=True)
    stack, regs = re.search(r"STACK:(\d+)", done.stdout), re.search(r"REG:(\d+)", done.stdout)
    return (int(stack.group(1)) if stack else None), (int(regs.group(1)) if regs else None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.kernels.compile_sm90", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--shard", default="0/1", help="I/N: compile every N-th launch from the I-th (0-based)")
    opts = ap.parse_args(argv)
    shard, shards = (int(v) for v in opts.shard.split("/"))
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("run without TRITON_INTERPRET")
        return 2
    # built lazily (each holds its tensors), every shards-th kept
    launches = ((dtype, launch) for dtype in (torch.bfloat16, torch.float32) for launch in _launches(dtype))
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for dtype, (fn, _grid, args, kwargs) in itertools.islice(launches, shard, None, shards):
            name = f"{fn.__name__} {TYPES[dtype]}"
            try:
                compiled = _compile(fn, args, kwargs)
            except Exception as exc:
                failures += 1
                print(f"FAIL {name}: {type(exc).__name__}: {exc}")
                continue
            stack, regs = _resources(compiled.asm["cubin"], Path(tmp))
            # a few bytes of stack are tolerated: the unsplit 128-key decode tile keeps 8 and is
            # still the fastest configuration measured (bench.kernels --sweep)
            checked = "attention" in fn.__module__ or "tail" in fn.__module__
            spills = bool(stack) and stack > SPILL_TOLERANCE and checked
            pdl_ok, pdl = _pdl_check(compiled, kwargs)
            if not _release_after_wait(compiled, kwargs):
                pdl_ok, pdl = False, " the head releases its successor before its wait"
            failures += spills or not pdl_ok
            status = "SPILL" if spills else ("ok" if pdl_ok else "FAIL")
            print(f"{status} {name} shared={compiled.metadata.shared} regs={regs} stack={stack}{pdl}")
        if shard == 0:
            failures += _compile_tma_tail(Path(tmp))
    return 1 if failures else 0


def _compile_tma_tail(tmp: Path) -> int:
    """kernels.decode_tail_tma (Gluon) at the Qwen3-0.6B shapes, with and without the next layer's qkv:
    within the shared memory, no spills, one bulk tensor copy per box. Returns the failures."""
    try:
        from kernels import decode_tail_tma as tma
        from kernels import decode_tail_tma_plan as tma_plan
    except ImportError as exc:
        print(f"skip _tail_tma_kernel: {exc}")
        return 0
    from kernels.reference import TailWeights

    failures = 0
    r = lambda *shape: torch.zeros(*shape, dtype=torch.bfloat16)
    for has_next in (True, False):
        nxt = (r(1024), 1e-6, r(4096, 1024), None) if has_next else (None, 1e-6, None, None)
        w = TailWeights(r(1024, 2048), None, r(1024), 1e-6, r(6144, 1024), None, r(1024, 3072), None, *nxt)
        p = tma_plan._plan_for(w, torch.device("cpu"))
        name = f"_tail_tma_kernel bf16 next={has_next}"
        try:
            with record_launches():  # configured as on the H200 (programmatic dependent launch)
                _, args, kwargs, _ = tma_plan.launch_args(r(1, 2048), r(1, 1024), w, p)
            compiled = compile_gluon(tma._tail_tma_kernel, args, kwargs)
        except Exception as exc:
            print(f"FAIL {name}: {type(exc).__name__}: {exc}")
            failures += 1
            continue
        stack, regs = _resources(compiled.asm["cubin"], tmp)
        copies = compiled.asm["ptx"].count("cp.async.bulk.tensor.3d")
        boxes = p.gu[0] + p.down[1] + p.qkv[0]
        pdl_ok, pdl = _pdl_check(compiled, kwargs)
        fits_shared = p.shared <= compiled.metadata.shared <= tma_plan.SHARED_LIMIT
        bad = bool(stack) or copies != boxes or not fits_shared
        bad = bad or not (pdl_ok and kwargs["PDL"])  # launched after the decode attention, overlapping it
        failures += bad
        print(f"{'FAIL' if bad else 'ok'} {name} shared={compiled.metadata.shared} regs={regs} stack={stack} "
              f"bulk copies={copies} of {boxes} boxes{pdl}")  # fmt: skip
    return failures


if __name__ == "__main__":
    sys.exit(main())
