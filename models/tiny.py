"""Tiny random checkpoints of the real architectures, saved as real safetensors folders with the
real Qwen2.5 tokenizer and a Qwen-style chat template: for tests, CPU benchmarks and the embedded
default model. Weights come from transformers' own model classes (torch.manual_seed(seed))."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from models.qwen_vocab import EMBEDDING_ROWS, EOS_ID, cache_dir, qwen_tokenizer_json

CHAT_TEMPLATE = Path(__file__).with_name("chat_template.jinja")

ARCHS = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
}

TINY_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    initializer_range=0.1,  # wider than HF's 0.02 so a random model's greedy path varies
)

# the CPU benchmark shape of benchmarks.md (C1; G1/M1 with the real vocabulary)
BENCH_SHAPE = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    tie_word_embeddings=True,
)


def write_tokenizer(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(qwen_tokenizer_json(), folder / "tokenizer.json")
    template = CHAT_TEMPLATE.read_text()
    (folder / "chat_template.jinja").write_text(template)
    cfg = {
        "tokenizer_class": "Qwen2Tokenizer",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "unk_token": None,
        "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
        "add_prefix_space": False,
        "errors": "replace",
        "split_special_tokens": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))


def build_checkpoint(
    folder: str | Path,
    arch: str = "qwen3",
    vocab_size: int = EMBEDDING_ROWS,
    seed: int = 0,
    shape: dict | None = None,
    max_shard_size: str | None = None,
    norm_spread: float = 0.0,
    **overrides,
) -> Path:
    """Write config.json, model.safetensors (or shards), tokenizer files into folder. norm_spread: the
    RMSNorm weights drawn around 1 with that standard deviation (transformers initialises them to ones)."""
    import torch
    import transformers

    if arch not in ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; known: {sorted(ARCHS)}")
    folder = Path(folder)
    config_cls, model_cls = (getattr(transformers, n) for n in ARCHS[arch])
    fields = dict(TINY_SHAPE if shape is None else shape)
    fields.update(vocab_size=vocab_size, eos_token_id=EOS_ID, bos_token_id=None, pad_token_id=None)
    if arch == "qwen2":
        fields.setdefault("use_sliding_window", False)
    fields.update(overrides)
    config = config_cls(**fields)
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    if norm_spread:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.copy_(1.0 + norm_spread * torch.randn_like(p))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, safe_serialization=True, **kwargs)
    write_tokenizer(folder)
    gen = {"eos_token_id": EOS_ID, "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(gen))
    return folder


def default_model_dir() -> Path:
    """The embedded default model (a tiny random Qwen3), built once into the cache."""
    folder = cache_dir() / "models" / "tiny-qwen3"
    if not (folder / "config.json").exists():
        tmp = folder.with_name(folder.name + ".building")
        shutil.rmtree(tmp, ignore_errors=True)
        build_checkpoint(tmp, "qwen3", shape=BENCH_SHAPE)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    return folder
