"""llama.cpp (llama-cpp-python) as cpu1's peer, in a process of its own: bench/cpu1.py runs this module
as a child and reads one JSON line back, so llama.cpp's OpenMP and CPU backends never share a process
with torch's (and a crash of the peer is not the benchmark's). It imports nothing of torch.

    python -m bench.llamacpp_peer FILE.gguf THREADS < {"single": [ids], "repeats": 3,
                                                      "c1": [[ids], ...], "c1_new": [n, ...]}

Prints {"single": {"prefill_s", "decode_tok_s"}, "c1_tok_s": float}; C1's requests run one after
another (the binding runs one sequence at a time)."""

from __future__ import annotations

import json
import sys
import time

NEW_TOKENS = 128


def generate(model, prompt: list[int], n: int) -> list[int]:
    model.reset()
    out: list[int] = []
    for tok in model.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        out.append(tok)
        if len(out) == n:
            break
    return out


def single(model, prompt: list[int], repeats: int) -> dict:
    def run(n: int) -> float:
        t0 = time.perf_counter()
        assert len(generate(model, prompt, n)) == n
        return time.perf_counter() - t0

    run(4)
    best: dict | None = None
    for _ in range(repeats):
        prefill, total = run(1), run(NEW_TOKENS)
        r = {"prefill_s": round(prefill, 3), "decode_tok_s": round((NEW_TOKENS - 1) / (total - prefill), 2)}
        best = r if best is None or r["decode_tok_s"] > best["decode_tok_s"] else best
    return best or {}


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        raise SystemExit(__doc__)
    from llama_cpp import Llama

    threads = int(sys.argv[2])
    job = json.loads(sys.stdin.read())
    model = Llama(
        model_path=sys.argv[1], n_threads=threads, n_threads_batch=threads, n_ctx=1024, verbose=False
    )
    result: dict = {"single": single(model, job["single"], job.get("repeats", 3))}
    if job.get("c1"):
        t0 = time.perf_counter()
        produced = sum(len(generate(model, p, n)) for p, n in zip(job["c1"], job["c1_new"], strict=True))
        result["c1_tok_s"] = produced / (time.perf_counter() - t0)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
