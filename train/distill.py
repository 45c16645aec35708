"""The base model's own answers to train/chat_pool.py's questions, rendered as the server renders a
plain chat turn, greedy, through chatloom's engine. Training uses them as the targets of turns no
tool fits, so the adapter learns "no call here" without learning new answers.

    python -m train.distill --out train/data/chat_answers.jsonl

Answers that do not end within --max-tokens are dropped (a cut answer would teach cutting)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from train.chat_pool import known_answer, questions

DEFAULT_OUT = Path(__file__).parent / "data" / "chat_answers.jsonl"


def distill(model_dir: str, qs: list[str], max_tokens: int, threads: int) -> list[dict]:
    from app.chat.template import ChatMessage, PromptRenderer
    from engine import LLM, SamplingParams

    llm = LLM(model_dir, device="cpu", dtype="float32", num_threads=threads)
    renderer = PromptRenderer(llm.tokenizer)
    prompts = [
        llm.tokenizer.encode(renderer.render([ChatMessage("user", q)], None), add_special_tokens=False)
        for q in qs
    ]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outs = llm.generate(prompts, params, use_tqdm=True)
    rows = []
    for q, out in zip(qs, outs, strict=True):
        done = out.outputs[0]
        text = done.text.strip()
        if known_answer(q):
            rows.append({"question": q, "answer": known_answer(q)})
        elif done.finish_reason == "stop" and text and "<tool_call>" not in text:
            rows.append({"question": q, "answer": text})
    return rows


def load(path: Path = DEFAULT_OUT) -> list[tuple[str, str]]:
    """(question, answer) pairs of a distill run; none where the file is absent."""
    if not path.exists():
        return []
    return [(r["question"], r["answer"]) for r in map(json.loads, path.read_text().splitlines())]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--n", type=int, default=360, help="questions drawn from train/chat_pool.py")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=120)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="float checkpoint folder (default: the embedded model's)")
    args = ap.parse_args()
    from train.generate import base_model_dir

    qs = questions(args.seed, args.n)
    rows = distill(args.model or base_model_dir(), qs, args.max_tokens, args.threads)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"kept {len(rows)} of {len(qs)} answers in {out}")


if __name__ == "__main__":
    main()
