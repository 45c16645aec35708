"""Kernels of the engine. Call them through `kernels.dispatch` (Triton on CUDA, torch reference otherwise).

reference.py          torch references: the semantics, and the CPU path
dispatch.py           the one dispatch point; its ops by role in dispatch_attention.py,
                      dispatch_pointwise.py and dispatch_linear.py (re-exported)
backend.py            Triton or reference per tensor (CHATLOOM_KERNELS=torch forces the references)
prefill_attention.py  paged prefill/extend (causal, GQA, cached prefix, optional split-K)
decode_attention.py   paged split-K decode (the new token's q/k work optionally fused)
decode_launch.py      the decode attention's checks, split count, tiles and arguments
attention_tiles.py    the online-softmax tile steps and split merge both attention kernels share
kv_cache.py           store_kv: new K/V rows into the paged cache
qk_norm_rope.py       fused q/k RMSNorm + RoPE + store_kv (one launch per layer before attention)
rmsnorm.py            rms_norm, fused residual-add + rms_norm
rope.py               rotate-half RoPE, in place
activation.py         silu_and_mul
bitmask.py            grammar token bitmask applied to logits in place
gemv*.py              decode-sized projections (gemv_norm.py: the RMSNorm fused into them)
decode_tail*.py       a decode layer's tail in one launch (cooperative.py: its grid barrier)
_jit.py               compiled-or-interpreted choice per launch (CPU tensors run in Triton's interpreter)
Micro-benchmarks: `python -m bench.kernels` (the bench/ package).
Tests: tests/kernels (interpreter on the CPU; `gpu` marker on CUDA; sm_90 compile check without a GPU).
"""
