"""Shared fixtures: tiny random checkpoints of the real architectures with the real Qwen tokenizer."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the app's Host check (CHATLOOM_ALLOWED_HOSTS) with Starlette's TestClient's own host name added:
# "testserver", a single-label name no DNS resolves (tests of the check itself set their own list)
os.environ.setdefault("CHATLOOM_ALLOWED_HOSTS", "localhost,127.0.0.1,::1,testserver")
# the default store of an app whose test names none (app.paths): a fresh folder per run, never the
# user's ~/.local/share/chatloom
# the embedded SmolLM2 as the GGUF file holds it (parity with HF): tests of the tuned model say so
os.environ.setdefault("CHATLOOM_EMBEDDED_ADAPTER", "0")
os.environ.setdefault("CHATLOOM_DATA_DIR", tempfile.mkdtemp(prefix="chatloom-tests-"))


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory):
    """checkpoint_factory(arch="qwen3", **overrides) -> folder; built once per argument set."""
    from models.tiny import build_checkpoint

    built: dict[tuple, Path] = {}

    def make(arch: str = "qwen3", **overrides) -> Path:
        key = (arch, tuple(sorted((k, repr(v)) for k, v in overrides.items())))
        if key not in built:
            folder = tmp_path_factory.mktemp(f"ckpt-{arch}")
            built[key] = build_checkpoint(folder, arch, **overrides)
        return built[key]

    return make


@pytest.fixture(scope="session")
def family_checkpoint(tmp_path_factory):
    """family_checkpoint(family) -> folder: a tiny random checkpoint wearing a real model family's
    tokenizer and chat template (tests/families.py: qwen, smollm2, mistral_v3, mistral_tekken, llama3);
    built once per session."""
    from tests.families import build_family_checkpoint

    built: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in built:
            built[family] = build_family_checkpoint(tmp_path_factory.mktemp(f"family-{family}"), family)
        return built[family]

    return make


@pytest.fixture(scope="session")
def tiny_qwen3(checkpoint_factory) -> Path:
    return checkpoint_factory("qwen3")


@pytest.fixture(scope="session")
def qwen_tokenizer(tiny_qwen3):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_qwen3)
