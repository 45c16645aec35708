"""outlines (outlines_core): the regex compiled to a token-level DFA over the whole vocabulary.

Compile walks every token from every DFA state (slow for big grammars); a step is then a table
lookup. outlines_core drops transitions from an accepting state into a non-accepting one, so the
grammar is compiled as regex + END with EOS spelling END: the only accepting state is after EOS.
"""

from __future__ import annotations

import torch
from outlines_core import Guide, Index, Vocabulary

from grammar.vocab import FORBIDDEN, TokenVocab

START, END = "\\x00", "\\x01"  # see budget._byte_dfa: the same two quirks, the same workaround


class OutlinesMatcher:
    __slots__ = ("guide",)

    def __init__(self, guide: Guide):
        self.guide = guide

    def accept_token(self, token_id: int) -> bool:
        try:
            self.guide.advance(token_id, return_tokens=False)
        except ValueError:
            return False
        return True

    def fill_mask(self, row: torch.Tensor) -> None:
        self.guide.write_mask_into(row.data_ptr(), row.numel(), 4)

    def rollback(self, num_tokens: int) -> None:
        self.guide.rollback_state(num_tokens)


class OutlinesGrammar:
    def __init__(self, index: Index, start_token: int):
        self.index = index
        self.start_token = start_token

    def matcher(self) -> OutlinesMatcher:
        guide = Guide(self.index, max_rollback=64)
        guide.advance(self.start_token, return_tokens=False)  # read START: now at the regex's start
        return OutlinesMatcher(guide)


class OutlinesBackend:
    name = "outlines"

    def __init__(self, vocab: TokenVocab):
        self.vocab = vocab
        table: dict[bytes, list[int]] = {}
        for tid, b in enumerate(vocab.token_bytes):
            if tid == vocab.eos_id:
                b = b"\x01"
            elif b == FORBIDDEN or not b:
                continue
            table.setdefault(b, []).append(tid)
        # outlines' own EOS and our START token: ids past every row, never in a mask we read (START
        # is only allowed in the initial state, outlines' EOS only after our EOS)
        self.start_token = vocab.vocab_size + 2
        table[b"\x00"] = [self.start_token]
        self.vocabulary = Vocabulary(vocab.vocab_size + 1, table)

    def compile(self, regex: str) -> OutlinesGrammar:
        try:
            return OutlinesGrammar(Index(f"{START}(?:{regex}){END}", self.vocabulary), self.start_token)
        except Exception as e:
            raise ValueError(f"outlines cannot compile the grammar: {e}") from e
