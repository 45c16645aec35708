"""`chatloom batch` against `LLM.generate` on the same prompts: offline throughput of the Batch API
path (request validation, prompt rendering, the async engine, result lines written per answer)
beside the bare offline engine.

    python -m bench.batch_throughput [--model PATH] [--lines 1000] [--max-tokens 32] [--device cpu]

Both runs get exactly the same work: the batch's chat requests (one shared system prompt, a
different user question each, greedy) are prepared once through the server's Serving.prepare_chat,
and LLM.generate receives those prompt ids and SamplingParams. Engine loading is outside both
timings, and each run starts with one untimed request of the set, so that both start with the
shared system prompt in the prefix cache (without it LLM.generate, which schedules every request
in its first steps, computes the shared prefix once per request: the prefix cache only holds
blocks already computed). Prints one JSON line per run and the ratio."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import tempfile
import time
from dataclasses import fields
from pathlib import Path

SYSTEM = (
    "You are a concise assistant for a workflow automation platform. Answer the user's question in "
    "one or two plain sentences. Do not use lists, headings or code unless the user asks for them."
)
TOPICS = ["a webhook", "a cron trigger", "an HTTP request node", "a retry policy", "a JSON schema"]


def request_lines(n: int, max_tokens: int) -> list[dict]:
    out = []
    for i in range(n):
        question = f"Request {i}: in one sentence, what is {TOPICS[i % len(TOPICS)]} used for in case {i}?"
        body = {
            "model": "bench",
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        out.append({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    return out


async def run_batch(settings, src: Path, out: Path) -> tuple[dict, list]:
    from app.batch.dispatch import answer, batch_serving
    from app.batch.offline import run_file
    from app.main import build_engine
    from app.schemas.chat import ChatCompletionRequest

    engine = await asyncio.to_thread(build_engine, settings)
    await engine.start()
    try:
        serving = batch_serving(engine, settings)
        first = json.loads(src.read_text().splitlines()[0])
        await answer(serving, first["url"], first["body"])  # warm-up (untimed): see main's doc
        summary = await run_file(serving, src, out, progress=True)
        # the same requests as LLM.generate will see them (untimed)
        prepared = []
        for text in src.read_text().splitlines():
            req = ChatCompletionRequest.model_validate(json.loads(text)["body"])
            prep = await serving.prepare_chat(req)
            prepared.append((prep.prompt_ids, prep.params))
        cache_hits = engine.stats().get("prefix_cache_hit_tokens")
    finally:
        await engine.shutdown()
    result = {
        "run": "chatloom batch",
        "lines": summary.total,
        "answered": summary.completed,
        "failed": summary.failed,
        "tokens": summary.tokens,
        "seconds": round(summary.seconds, 2),
        "tok_per_s": round(summary.tokens / summary.seconds, 1),
        "req_per_s": round(summary.completed / summary.seconds, 2),
        "prefix_cache_hit_tokens": cache_hits,  # the untimed prepare_chat pass adds none (no engine work)
    }
    return result, prepared


def run_llm(settings, model: str, prepared: list) -> dict:
    from engine import LLM

    config = settings.engine_config(model)
    llm = LLM(model, **{f.name: getattr(config, f.name) for f in fields(config) if f.name != "model"})
    prompts = [ids for ids, _ in prepared]
    params = [p for _, p in prepared]
    llm.generate(prompts[:1], params[:1])  # warm-up (untimed): see main's doc
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=True)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    cache_hits = llm.stats().get("prefix_cache_hit_tokens")
    del llm
    gc.collect()
    return {
        "run": "LLM.generate",
        "lines": len(prompts),
        "tokens": tokens,
        "seconds": round(seconds, 2),
        "tok_per_s": round(tokens / seconds, 1),
        "req_per_s": round(len(prompts) / seconds, 2),
        "prefix_cache_hit_tokens": cache_hits,
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m bench.batch_throughput", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="checkpoint folder or .gguf (default: the embedded default model)")
    p.add_argument("--lines", type=int, default=1000)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-num-seqs", type=int, default=256)
    args = p.parse_args(argv)

    from app.settings import Settings

    model = args.model
    if not model:
        from models.gguf import default_checkpoint

        model = str(default_checkpoint())
    settings = Settings(model=model, device=args.device, dtype=args.dtype, max_num_seqs=args.max_num_seqs)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        src.write_text("".join(json.dumps(x) + "\n" for x in request_lines(args.lines, args.max_tokens)))
        batch, prepared = asyncio.run(run_batch(settings, src, out))
        llm = run_llm(settings, model, prepared)
    report = {"model": Path(model).name, "device": args.device, "batch": batch, "llm": llm}
    report["batch_vs_llm_tok_per_s"] = round(batch["tok_per_s"] / llm["tok_per_s"], 3)
    for item in (batch, llm):
        print(json.dumps(item))
    print(json.dumps({"batch_vs_llm_tok_per_s": report["batch_vs_llm_tok_per_s"], "model": report["model"]}))
    return report


if __name__ == "__main__":
    main()
