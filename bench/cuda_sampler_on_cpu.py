"""The tuned embedded model's held-out tool calls on the CPU with the sampler on its CUDA path: grammar
masks in a device-mask table and the fused Triton sampler, run through Triton's interpreter.

A diagnostic for the GPU-only failure of docs/performance.md (session 5, issue 50): on an H100 the
tuned model wrote no calls with the grammar on. Here the sampler's CUDA path meets the real model and
grammar without a GPU (the forward stays on the CPU's kernels); slow: ~10 minutes for 4 cases.

    python -m bench.cuda_sampler_on_cpu --calls 4   # CPU tensors run Triton through its interpreter
"""

from __future__ import annotations

import argparse
import types


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-device-masks", action="store_true", help="masks applied apart (device_mask_rows=0)")
    args = ap.parse_args()

    import torch

    import runner.sampler as sampler_mod
    from kernels import dispatch
    from kernels.sampling import sample_tokens as triton_sample
    from runner.device_masks import DeviceMasks
    from train import eval_tools

    ops = types.SimpleNamespace(**{k: getattr(dispatch, k) for k in dir(dispatch) if not k.startswith("__")})
    ops.use_triton = lambda t: True  # the sampler's ops only: the model's kernels keep their CPU paths

    def fused(logits, temps, seed, generator=None, mask=None, mask_rows=None, out=None):
        return triton_sample(logits.contiguous(), temps, seed, mask=mask, mask_rows=mask_rows, out=out)

    ops.sample_tokens = fused
    sampler_mod.ops = ops
    init = sampler_mod.Sampler.__init__

    def with_table(self, vocab_size, *a, **k):
        init(self, vocab_size, *a, **k)
        if not args.no_device_masks:
            self.device_masks = DeviceMasks((vocab_size + 31) // 32, 8, 64, torch.device("cpu"))

    sampler_mod.Sampler.__init__ = with_table
    rows = eval_tools.evaluate(["tuned"], [True], args.seed, args.calls, 0, 0, 0)
    print(eval_tools.table(rows))
    for r in rows:
        for metric, asked, got in r["failures"]:
            print(f"{metric}: {asked!r} -> {str(got)[:200]}")


if __name__ == "__main__":
    main()
