"""The engine's host work per step, without the model: a real EngineCore (tiny checkpoint, CPU, the
overlapped step as on CUDA) whose forward and sampling kernels are replaced by stubs, so what is
timed is what the host does between two launches: schedule, build the step's tensors, read back and
accept tokens (detokenize, stop checks), record computed K/V.

    python -m bench.host_step --batch 32 256 --steps 200 [--profile]
    python -m bench.host_step --spec 4 --batch 1 4 16      # speculative steps (S1's host side)

Prompts of 100..1,900 tokens (block_size 16: up to ~125 blocks per table, as in W2's long tail);
every sequence decodes past the timed steps, so the batch stays full.

--spec K: n-gram speculation with K proposals, greedy. The prompts repeat a period of distinct
tokens and the stub "model" always continues the period, so every proposal is accepted: every step
verifies K + 1 tokens per sequence and finishes its predecessor first (as on CUDA, where only steps
that propose nothing overlap), and the host's cost per token is what bounds S1 where the device's
step is short."""

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


PERIOD = 97  # the spec stub's period: distinct token ids 1000..1096


def _successor(tok: int) -> int:
    return 1000 + (tok - 1000 + 1) % PERIOD


def _stub_periodic_model(core) -> None:
    """--spec: every logits row (sampled or verified) puts its maximum on the token after that row's
    input token in the period, so n-gram proposals are always right."""
    import torch

    runner, vocab = core.runner, core.vocab_size

    def execute(batch, pending=None, temps=None):
        step = runner.prepare(batch, pending)
        inputs: list[int] = []
        for i in step.sampling:  # the sampled rows: each sequence's last token
            inputs.append(batch.seqs[i].token_ids[-1])
        for seq in batch.seqs:  # then the verified chunks, in batch order: last real token + drafts
            if seq.spec_tokens:
                inputs.append(seq.token_ids[-1])
                inputs.extend(seq.spec_tokens)
        if not inputs:
            return None, [], None
        logits = torch.zeros((len(inputs), vocab))
        logits[torch.arange(len(inputs)), torch.tensor([_successor(t) for t in inputs])] = 1.0
        return logits, step.sampling, None

    runner.execute = execute
    core.sampler.process = lambda logits, seqs: logits
    core.sampler.sample = lambda logits, seqs, static=None: logits.argmax(dim=-1)


def run_spec(batch: int, steps: int, k: int, profile: bool, folder: Path) -> dict:
    """Host time of speculative steps: tokens per step and CPU per token, by part."""
    from bench.observe import Profile
    from bench.step_timers import StepTimers
    from engine.config import EngineConfig
    from engine.engine_core import EngineCore
    from runner.sampling_params import SamplingParams

    period = list(range(1000, 1000 + PERIOD))
    config = EngineConfig(
        model=str(folder),
        device="cpu",
        dtype="float32",
        num_kv_blocks=batch * 4096 // 16 + 64,
        max_num_seqs=batch,
        max_model_len=4096,
        num_threads=1,
        speculative_method="ngram",
        num_speculative_tokens=k,
        enable_prefix_caching=False,
    )
    core = EngineCore(config)
    _stub_periodic_model(core)
    seqs = []
    for i in range(batch):
        prompt = (period * 3)[i : i + 2 * PERIOD + 20]  # each its own phase
        params = SamplingParams(temperature=0.0, max_tokens=4096 - len(prompt) - 1, ignore_eos=True)
        seqs += core.add_request(f"r{i}", prompt, params)
    for _ in range(8):
        core.step()
    timers = StepTimers(time.thread_time)
    timers.wrap(core.spec, "propose", "propose")
    timers.wrap(core.scheduler, "schedule", "schedule")
    timers.wrap(core.runner, "prepare", "prepare")
    timers.wrap(core, "_verify", "verify (accept, detokenize)")
    timers.wrap(core, "_finish", "finish")
    timers.wrap(core.scheduler, "after_step", "after_step")
    before = sum(s.num_output_tokens for s in seqs)
    with Profile(enabled=profile) as prof:
        c0, t0 = time.thread_time(), time.perf_counter()
        for _ in range(steps):
            core.step()
        cpu, wall = time.thread_time() - c0, time.perf_counter() - t0
    prof.report(wall, steps)
    tokens = sum(s.num_output_tokens for s in seqs) - before
    assert tokens >= steps * batch * (k + 1) // 2, f"speculation accepted too little: {tokens} tokens"
    result = {
        "batch": batch,
        "k": k,
        "tokens_per_step": tokens / steps,
        "cpu_us_per_step": cpu / steps * 1e6,
        "cpu_us_per_token": cpu / tokens * 1e6,
        "wall_us_per_step": wall / steps * 1e6,
        "parts_us": {name: v / steps * 1e6 for name, v in timers.totals.items()},
    }
    core.abort_all()
    return result


def run(batch: int, steps: int, profile: bool, folder: Path) -> dict:
    from bench.observe import Profile
    from bench.step_timers import StepTimers
    from engine.config import EngineConfig
    from engine.engine_core import EngineCore
    from runner.sampling_params import SamplingParams

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
    wall, cpu = [], []
    with Profile(enabled=profile) as prof:
        for _ in range(steps):
            t, c = time.perf_counter(), time.thread_time()
            core.step()
            cpu.append(time.thread_time() - c)
            wall.append(time.perf_counter() - t)
    prof.report(sum(wall), steps)
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
    p.add_argument("--spec", type=int, default=0, metavar="K", help="speculative steps with K proposals")
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from models.tiny import build_checkpoint

    args = build_parser().parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_checkpoint(Path(tmp), "qwen3", vocab_size=10240, seed=0)
        for batch in args.batch:
            if args.spec:
                r = run_spec(batch, args.steps, args.spec, args.profile, folder)
                parts = ", ".join(f"{k} {v:.0f}" for k, v in r["parts_us"].items())
                print(
                    f"batch {batch}, {args.spec} proposals: {r['tokens_per_step']:.1f} tokens a step, "
                    f"CPU {r['cpu_us_per_step']:.0f} us a step = {r['cpu_us_per_token']:.0f} us a token "
                    f"(wall {r['wall_us_per_step']:.0f} us a step); CPU per step in {parts}"
                )
                results.append(r)
                continue
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
