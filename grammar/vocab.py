"""The token table of one tokenizer, for llguidance and for the budget automaton.

llguidance reads the tokenizer itself (its HF adapter: byte-level BPE, SentencePiece with byte
fallback, tiktoken-style vocabularies), which gives every token's bytes. The budget automaton
(budget.py) walks a byte-level DFA, so it needs one byte string per token id, with special tokens
made distinguishable from text:
- ordinary tokens: their real bytes;
- the call markers that are single special tokens (`<tool_call>`, `</tool_call>`, `[TOOL_CALLS]`,
  `<|python_tag|>`): one control byte each (MARKER_BYTES), which no JSON string or free text contains;
- the end-of-turn token (EOS): no bytes; the automaton reads it as its END symbol;
- every other special token, and any ordinary token containing a reserved control byte: FORBIDDEN, a
  byte no grammar ever allows;
- ids past the tokenizer (padded embedding rows): never allowed.

llguidance infers how tokens map to bytes from tokenizer.json's decoder. A byte-level vocabulary
whose decoder is a chain ending in ByteLevel (what transformers 5.17 writes when it converts a GGUF
with a `gpt2` vocabulary: ByteFallback, Fuse, Replace, ByteLevel) would be read as literal text
("Ċ" instead of a newline), so llguidance gets the ByteLevel decoder alone; a probe of common texts
then checks that llguidance spells them as the tokenizer does, and a vocabulary it still misreads
is refused with a clear error instead of masks that allow the wrong tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from grammar.per_object import PerObjectCache

FORBIDDEN = b"\x00"
# the control bytes standing for single-token call markers in the budget's regexes
MARKER_BYTES = {
    "<tool_call>": b"\x02",
    "</tool_call>": b"\x03",
    "[TOOL_CALLS]": b"\x04",
    "<|python_tag|>": b"\x05",
}
RESERVED = set(range(6))  # control bytes free text and JSON strings never carry in our grammars
TEXT_CHAR = r"[^\x00-\x05]"  # a character of free text: anything but the RESERVED bytes
# end-of-turn tokens of chat templates, most specific first; else the tokenizer's eos_token
_TURN_ENDS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")
# texts every vocabulary spells; llguidance must give back their bytes from the tokenizer's ids
_PROBES = ("\n", " the", '{"name": "x"}', "\n\n  ok", "caf\u00e9 \u2014 \u4e2d")


def byte_decoder() -> dict[str, int]:
    """The raw byte behind each printable stand-in character of byte-level BPE vocabularies."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}


def raw_tokenizer(tokenizer):
    """The `tokenizers.Tokenizer` behind an HF tokenizer (or the object itself)."""
    raw = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    return raw or tokenizer


@dataclass
class TokenVocab:
    token_bytes: list[bytes]  # (n_tokens,): what the budget automaton sees per id
    eos_id: int  # the end-of-turn token every grammar ends with
    vocab_size: int  # model vocabulary (bitmask width follows it); >= len(token_bytes)
    encode: object = field(repr=False)  # str -> list[int], ordinary tokenization (no special tokens)
    special_ids: frozenset[int] = frozenset()
    markers: dict[str, int] = field(default_factory=dict)  # marker text -> its special token id
    ll_tokenizer: object = field(default=None, repr=False)  # llguidance.LLTokenizer

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


def turn_end_id(tokenizer) -> int:
    """The token that ends an assistant turn: the chat format's own where the vocabulary has one."""
    raw = raw_tokenizer(tokenizer)
    for text in _TURN_ENDS:
        tid = raw.token_to_id(text)
        if tid is not None:
            return tid
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        return eos
    for text in ("</s>", "<|endoftext|>", "<eos>"):
        tid = raw.token_to_id(text)
        if tid is not None:
            return tid
    raise ValueError("the tokenizer has no end-of-turn token (no eos_token_id and none of the known ones)")


def llguidance_json(raw) -> str:
    """tokenizer.json as llguidance should read it: a byte-level vocabulary (ByteLevel pre-tokenizer)
    whose decoder chain ends in ByteLevel gets that decoder alone (its other steps are no-ops on
    such tokens, but they make llguidance take the tokens for literal text)."""
    text = raw.to_str()
    spec = json.loads(text)
    dec, pre = spec.get("decoder") or {}, spec.get("pre_tokenizer") or {}
    chain = dec.get("decoders") or []
    pres = pre.get("pretokenizers") or [pre]
    byte_level_pre = any(p.get("type") == "ByteLevel" for p in pres if isinstance(p, dict))
    if dec.get("type") == "Sequence" and chain and chain[-1].get("type") == "ByteLevel" and byte_level_pre:
        spec["decoder"] = chain[-1]
        if isinstance(spec.get("model"), dict):
            spec["model"]["byte_fallback"] = False
        return json.dumps(spec)
    return text


def _check_spelling(raw, ll) -> None:
    """Refuse a vocabulary llguidance reads differently from the tokenizer (its masks would allow
    tokens whose text is not what the grammar meant)."""
    for text in _PROBES:
        ids = raw.encode(text, add_special_tokens=False).ids
        got = ll.decode_bytes(ids)
        # SentencePiece vocabularies add a word-start space that the tokenizer's decode drops
        if got not in (text.encode(), b" " + text.encode()) and raw.decode(ids) == text:
            raise ValueError(
                f"llguidance reads this tokenizer's vocabulary differently from the tokenizer "
                f"({text!r} is spelled {got!r}); grammar-constrained output is not possible with it"
            )


def _build(tokenizer, vocab_size: int | None) -> TokenVocab:
    import llguidance

    raw = raw_tokenizer(tokenizer)
    n = raw.get_vocab_size(with_added_tokens=True)
    if vocab_size is None:
        vocab_size = n
    if vocab_size < n:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {n} tokens")
    eos_id = turn_end_id(tokenizer)
    # llguidance's own adapter reads tokenizer.json (normalizer, byte fallback, added tokens)
    from grammar.llguidance_backend import SLICES

    ll = llguidance.LLTokenizer(llguidance_json(raw), n_vocab=vocab_size, eos_token=eos_id, slices=SLICES)
    _check_spelling(raw, ll)
    added = {tid: tok.content for tid, tok in raw.get_added_tokens_decoder().items()}
    token_bytes: list[bytes] = []
    special: set[int] = set()
    markers: dict[str, int] = {}
    for tid in range(n):
        if ll.is_special_token(tid) or tid in added:
            special.add(tid)
            content = added.get(tid) or ll.decode_str([tid])
            if tid == eos_id:
                token_bytes.append(b"")
            elif content in MARKER_BYTES and content not in markers:
                markers[content] = tid
                token_bytes.append(MARKER_BYTES[content])
            elif tid in added and not ll.is_special_token(tid):
                # an added token that is ordinary text for the tokenizer (llguidance spells it too)
                b = ll.decode_bytes([tid])
                token_bytes.append(FORBIDDEN if not b or any(x in RESERVED for x in b) else b)
            else:
                token_bytes.append(FORBIDDEN)
            continue
        b = ll.decode_bytes([tid])
        if not b or any(x in RESERVED for x in b):
            b = FORBIDDEN
        token_bytes.append(b)

    def encode(text: str) -> list[int]:
        return raw.encode(text, add_special_tokens=False).ids

    return TokenVocab(token_bytes, eos_id, vocab_size, encode, frozenset(special), markers, ll)
