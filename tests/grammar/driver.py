"""The engine's constrained loop, simulated: fill bitmask -> mask random logits -> sample -> accept.

Random logits: a seeded (K, vocab) table of N(0,1) rows, one per step (rows cycle; a per-request
roll keeps requests apart); argmax over the allowed tokens is an exact sample of softmax(random
logits) restricted to the mask. `open_bias` adds a logit bias to the <tool_call> token (auto mode).
"""

from __future__ import annotations

import json
import re

import numpy as np
import torch

from grammar.vocab import TokenVocab, allowed_ids  # allowed_ids: tests import it from here

OPEN_ID, CLOSE_ID = 151657, 151658
CALL_RE = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)


class RandomLogits:
    def __init__(self, vocab_size: int, seed: int, rows: int = 32):
        gen = torch.Generator().manual_seed(seed)
        self.table = torch.randn(rows, vocab_size, generator=gen).numpy()  # (rows, vocab) float32
        self.rng = np.random.default_rng(seed)

    def row(self, step: int, shift: int) -> np.ndarray:
        return np.roll(self.table[(step + shift) % len(self.table)], shift)


def decode(
    factory, vocab: TokenVocab, max_tokens: int, logits: RandomLogits, open_bias: float = 0.0, check=None
) -> list[int]:
    """One request through the constraint; returns the generated ids (EOS included if reached)."""
    c = factory.new()
    bitmask = torch.empty(1, vocab.mask_words, dtype=torch.int32)
    shift = int(logits.rng.integers(vocab.vocab_size))
    out: list[int] = []
    for step in range(max_tokens):
        bitmask.fill_(-1)
        c.fill_bitmask(bitmask, 0, max_tokens - step)
        ids = allowed_ids(bitmask[0], vocab.vocab_size)
        assert len(ids), f"empty mask after {out}"
        row = logits.row(step, shift)[ids]
        if open_bias:
            row = row + np.where(ids == OPEN_ID, open_bias, 0.0)
        tok = int(ids[int(np.argmax(row))])
        if check is not None:
            check(c, bitmask, tok)
        assert c.accept_token(tok), f"matcher refused its own mask: {tok} after {out}"
        out.append(tok)
        if c.is_terminated():
            break
    return out


def split_output(text: str) -> tuple[str, list[dict]]:
    """Model text (special tokens kept) -> (content before calls, parsed calls)."""
    if text.endswith("<|im_end|>"):
        text = text[: -len("<|im_end|>")]
    first = text.find("<tool_call>")
    content = text if first < 0 else text[:first]
    calls = [json.loads(body) for body in CALL_RE.findall(text)]
    if first >= 0:
        rest = CALL_RE.sub("", text[first:]).strip("\n")
        assert rest == "", f"text outside calls: {rest!r}"
    return content, calls
