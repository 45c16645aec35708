"""The engine's host work per step, without the model: a real EngineCore (tiny checkpoint, CPU, the
overlapped step as on CUDA) whose forward and sampling kernels are replaced by stubs, so what is
timed is what the host does between two launches: schedule, build the step's tensors, read back and
accept tokens (detokenize, stop checks), record computed K/V.

    python -m bench.host_step --batch 32 256 --steps 200 [--profile]

Prompts of 100..1,900 tokens (block_size 16: up to ~125 blocks per table, as in W2's long tail);
every sequence decodes past the timed steps, so the batch stays full."""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path


def _stub_device_work(core, seed: int) -> None:
    """Forward: the real prepare, then fake logits; sampling: random ids from a fixed stream."""
    import torch

    runner = core.runner
    gen = torch.Generator().manual_seed(seed)
    stream = torch.randint(0, 10000, (1 << 20,), generator=gen)
    state = {"at": 0}

    def execute(batch, pending=None, temps=None):
        step = runner.prepare(batch, pending)
        if not step.sampling:
            return None, [], None
        return torch.zeros((len(step.sampling), 1)), step.sampling, None

    def sample(logits, seqs, static=None):
        at = state["at"]
        if at + len(seqs) > stream.numel():
            at = 0
        state["at"] = at + len(seqs)
        return stream[at : at + len(seqs)].clone()

    runner.execute = execute
    core.sampler.process = lambda logits, seqs: logits
    core.sampler.sample = sample


def run(batch: int, steps: int, profile: bool, folder: Path) -> dict:
    from bench.step_timers import StepTimers
    from engine.config import EngineConfig
    from engine.engine_core import EngineCore
    from engine.sampling_params import SamplingParams

    rng = random.Random(0)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(100, 1900))] for _ in range(batch)]
    warm = 8
    # room for the decodes of the prefill phase (early sequences decode while later ones prefill)
    need = sum(-(-(len(p) + 2 * (warm + steps) + 400) // 16) for p in prompts)
    config = EngineConfig(
        model=str(folder),
        device="cpu",
        dtype="float32",
        num_kv_blocks=max(need, batch * 4096 // 16) + 64,
        max_num_seqs=batch,
        max_model_len=4096,
        async_scheduling=True,
        num_threads=1,
    )
    core = EngineCore(config)
    _stub_device_work(core, seed=1)
    for i, p in enumerate(prompts):
        params = SamplingParams(temperature=0.6, max_tokens=4096 - len(p) - 1, ignore_eos=True)
        core.add_request(f"r{i}", p, params)

    t0 = time.perf_counter()
    prefill_steps = 0
    while core.scheduler.waiting or any(s.num_uncomputed_tokens > 1 for s in core.scheduler.running):
        core.step()
        prefill_steps += 1
    prefill_s = time.perf_counter() - t0
    for _ in range(warm):
        core.step()

    timers = StepTimers(time.thread_time)  # this thread's CPU: other processes barely move it
    timers.wrap(core.scheduler, "schedule", "schedule")
    timers.wrap(core.runner, "prepare", "prepare")
    timers.wrap(core, "_finish", "finish (accept, detokenize)")
    timers.wrap(core.scheduler, "after_step", "after_step")
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    wall, cpu = [], []
    for _ in range(steps):
        t, c = time.perf_counter(), time.thread_time()
        core.step()
        cpu.append(time.thread_time() - c)
        wall.append(time.perf_counter() - t)
    if prof is not None:
        import pstats

        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)
    running = len(core.scheduler.running)
    assert running == batch, f"the batch shrank to {running}"
    result = {
        "batch": batch,
        "prefill_steps": prefill_steps,
        "prefill_ms_per_step": prefill_s / max(prefill_steps, 1) * 1e3,
        "cpu_median_us": statistics.median(cpu) * 1e6,
        "cpu_mean_us": statistics.fmean(cpu) * 1e6,
        "wall_median_us": statistics.median(wall) * 1e6,
        "parts_us": {k: v / steps * 1e6 for k, v in timers.totals.items()},
    }
    core.abort_all()
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.host_step", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[32, 256], help="running sequences")
    p.add_argument("--steps", type=int, default=200, help="timed decode steps per batch size")
    p.add_argument("--profile", action="store_true", help="cProfile the timed steps (distorts times)")
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from engine.models.tiny import build_checkpoint

    args = build_parser().parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_checkpoint(Path(tmp), "qwen3", vocab_size=10240, seed=0)
        for batch in args.batch:
            r = run(batch, args.steps, args.profile, folder)
            parts = ", ".join(f"{k} {v:.0f}" for k, v in r["parts_us"].items())
            print(
                f"batch {batch}: decode step CPU median {r['cpu_median_us']:.0f} us, "
                f"mean {r['cpu_mean_us']:.0f} us, wall median {r['wall_median_us']:.0f} us; "
                f"CPU per step in {parts}; "
                f"prefill {r['prefill_ms_per_step']:.1f} ms/step x {r['prefill_steps']}"
            )
            results.append(r)
    return results


if __name__ == "__main__":
    main()
