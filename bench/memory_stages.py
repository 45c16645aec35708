"""Resident memory of a CPU engine at each stage of its life (issue 42's 2 GB budget): imports, the
engine built (weights, KV pool, packing), a first short request, and a long prefill, with the peak
(VmHWM, reset between stages) beside each current figure.

    python -m bench.memory_stages [--model PATH_OR_GGUF] [--prefill 5000] [--max-num-batched-tokens N]
"""

from __future__ import annotations

import argparse
import gc
import os


def _status(key: str) -> int:  # KiB
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _stage(name: str) -> None:
    gc.collect()
    print(
        f"{name:34s} rss {_status('VmRSS') >> 10:6d} MiB   peak since last {_status('VmHWM') >> 10:6d} MiB",
        flush=True,
    )
    try:
        with open("/proc/self/clear_refs", "w") as f:  # resets VmHWM to the current RSS
            f.write("5")
    except OSError:
        pass


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.memory_stages", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2 GGUF")
    ap.add_argument("--prefill", type=int, default=5000, help="prompt tokens of the long request")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    args = ap.parse_args(argv)
    _stage("start")
    import torch  # noqa: F401

    _stage("import torch")
    from engine.config import EngineConfig
    from engine.engine_core import EngineCore
    from models.gguf import default_checkpoint
    from runner.sampling_params import SamplingParams

    _stage("import the engine")
    config = EngineConfig(
        model=args.model or default_checkpoint(),
        device="cpu",
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    core = EngineCore(config)
    _stage("engine built")

    def run(rid: str, prompt) -> None:
        core.add_request(rid, prompt, SamplingParams(max_tokens=4, temperature=0))
        while core.has_unfinished():
            core.step()

    run("short", "hello there")
    _stage("a short request")
    run("long", [1000 + i % 20000 for i in range(args.prefill)])
    _stage(f"a {args.prefill}-token prefill")


if __name__ == "__main__":
    main()
