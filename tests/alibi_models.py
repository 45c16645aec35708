"""Tiny random BLOOM and MPT checkpoints (transformers' own config and model classes, saved as
safetensors) with the real Qwen2.5 tokenizer, for the ALiBi family's tests.

Six heads, so the slopes past the largest power of two (each family's own rule) are exercised. The
weights are drawn wider than transformers' default (std 0.3) and the LayerNorm weights spread around
one, so a random model's greedy path varies from token to token; BLOOM's fused qkv bias is drawn large
enough that a wrong per-head reordering at load changes the tokens, its other biases small (large ones
make every continuation one repeated token)."""

from __future__ import annotations

import json
from pathlib import Path

from models.qwen_vocab import EMBEDDING_ROWS, EOS_ID
from models.tiny import write_tokenizer

SHAPES = {
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(hidden_size=96, n_layer=2, n_head=6)),
    "mpt": ("MptConfig", "MptForCausalLM", dict(d_model=96, n_heads=6, n_layers=2, max_seq_len=4096)),
}


def build_alibi_checkpoint(folder: str | Path, arch: str, seed: int = 0, chat_template: bool = False,
                           **overrides) -> Path:  # fmt: skip
    """config.json, model.safetensors, tokenizer files and generation_config.json in folder. Without
    chat_template the folder has none (as BLOOM's and MPT's base checkpoints): the app falls back to
    its own."""
    import torch
    import transformers

    config_name, model_name, shape = SHAPES[arch]
    fields = dict(shape, vocab_size=EMBEDDING_ROWS, eos_token_id=EOS_ID, bos_token_id=None, pad_token_id=None,
                  initializer_range=0.3, tie_word_embeddings=True)  # fmt: skip
    fields.update(overrides)
    config = getattr(transformers, config_name)(**fields)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_((0.3 if "query_key_value" in name else 0.02) * torch.randn_like(p))
            elif "norm" in name or "ln_f" in name:  # the LayerNorm weights
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    folder = Path(folder)
    model.save_pretrained(folder, safe_serialization=True)
    write_tokenizer(folder)
    if not chat_template:
        (folder / "chat_template.jinja").unlink()
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS_ID, "do_sample": False}))
    return folder
