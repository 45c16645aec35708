"""The token table every grammar backend and the budget automaton share.

Grammars here are byte-level regexes. Each token id gets the bytes the grammar sees for it:
- ordinary tokens: their real bytes (byte-level BPE);
- `<tool_call>` / `</tool_call>`: the single control bytes TAG_OPEN / TAG_CLOSE, so a call tag is one
  symbol that no JSON string and no free text may contain (both exclude control bytes);
- the EOS token: no bytes; backends treat it as the stop token, allowed only where the grammar may end;
- every other special token, and any real token containing a control byte we reserve: FORBIDDEN, a
  byte no grammar ever allows;
- ids past the tokenizer's vocabulary (model embedding rows 151665..151935): never allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from grammar.per_object import PerObjectCache

TAG_OPEN = b"\x02"
TAG_CLOSE = b"\x03"
FORBIDDEN = b"\x00"
RESERVED = {0, 1, 2, 3}  # control bytes the grammars reserve (free text and strings exclude them)
OPEN_TAG_TEXT = "<tool_call>"
CLOSE_TAG_TEXT = "</tool_call>"
EOS_TEXT = "<|im_end|>"


def byte_decoder() -> dict[str, int]:
    """The raw byte behind each printable stand-in character of byte-level BPE vocabularies."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}


def _raw_tokenizer(tokenizer):
    """The `tokenizers.Tokenizer` behind an HF tokenizer (or the object itself)."""
    raw = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    return raw or tokenizer


@dataclass
class TokenVocab:
    token_bytes: list[bytes]  # (n_tokens,): what the grammar sees per id
    eos_id: int
    vocab_size: int  # model vocabulary (bitmask width follows it); >= len(token_bytes)
    encode: object = field(repr=False)  # str -> list[int], ordinary tokenization (no special tokens)
    special_ids: frozenset[int] = frozenset()

    @property
    def n_tokens(self) -> int:
        return len(self.token_bytes)

    @property
    def mask_words(self) -> int:
        return (self.vocab_size + 31) // 32

    @cached_property
    def byte_lengths(self) -> np.ndarray:  # (n_tokens,) int32
        return np.fromiter((len(b) for b in self.token_bytes), dtype=np.int32, count=self.n_tokens)


def bools_to_bitmask(bits: np.ndarray) -> torch.Tensor:
    """(k*32,) bool -> (k,) int32 bitmask, bit j of word i = token 32*i + j."""
    packed = np.packbits(bits.reshape(-1, 32), axis=1, bitorder="little")  # (k, 4) uint8
    return torch.from_numpy(packed.copy().view(np.int32).reshape(-1))


def allowed_ids(bitmask_row: torch.Tensor, vocab_size: int) -> np.ndarray:
    """(words,) int32 CPU bitmask row -> the allowed token ids below vocab_size, ascending."""
    bits = np.unpackbits(bitmask_row.numpy().view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:vocab_size])


_cache: PerObjectCache[TokenVocab] = PerObjectCache()


def vocab_for(tokenizer, vocab_size: int | None = None) -> TokenVocab:
    """Build (once per tokenizer object and vocab size) the shared token table."""
    return _cache.get(tokenizer, (vocab_size,), lambda: _build(tokenizer, vocab_size))


def _build(tokenizer, vocab_size: int | None) -> TokenVocab:
    raw = _raw_tokenizer(tokenizer)
    n = raw.get_vocab_size(with_added_tokens=True)
    decoder = byte_decoder()
    added = {}
    for tid, tok in raw.get_added_tokens_decoder().items():
        added[tid] = tok
    eos_id = raw.token_to_id(EOS_TEXT)
    if eos_id is None:
        eos_id = getattr(tokenizer, "eos_token_id", None)
    if eos_id is None:
        raise ValueError("tokenizer has no <|im_end|> and no eos_token_id")
    token_bytes: list[bytes] = []
    special: set[int] = set()
    for tid in range(n):
        if tid in added:
            content = added[tid].content
            special.add(tid)
            if content == OPEN_TAG_TEXT:
                token_bytes.append(TAG_OPEN)
            elif content == CLOSE_TAG_TEXT:
                token_bytes.append(TAG_CLOSE)
            elif tid == eos_id:
                token_bytes.append(b"")
            else:
                token_bytes.append(FORBIDDEN)
            continue
        piece = raw.id_to_token(tid)
        if piece is None:
            token_bytes.append(FORBIDDEN)
            continue
        try:
            b = bytes(decoder[c] for c in piece)
        except KeyError:  # not a byte-level piece
            b = piece.encode()
        if any(x in RESERVED for x in b):
            b = FORBIDDEN
        token_bytes.append(b)
    if vocab_size is None:
        vocab_size = n
    if vocab_size < n:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {n} tokens")

    def encode(text: str) -> list[int]:
        return raw.encode(text, add_special_tokens=False).ids

    return TokenVocab(token_bytes, eos_id, vocab_size, encode, frozenset(special))
