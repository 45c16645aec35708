"""The shipped adapter is merged when (and only when) the embedded GGUF is served."""

from __future__ import annotations

import shutil

import pytest

from models import adapter as adapter_mod
from models import gguf as gguf_mod

# peft asks transformers a deprecated question (transformers 5.24)
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")


@pytest.fixture
def setup(tiny_llama, tmp_path, monkeypatch):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    converted = tmp_path / "gguf" / "SmolLM2-converted"
    shutil.copytree(tiny_llama, converted)
    model = AutoModelForCausalLM.from_pretrained(converted)
    config = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "down_proj"], init_lora_weights=False)
    shipped = tmp_path / "adapters" / "smollm2_tools"
    get_peft_model(model, config).save_pretrained(shipped)
    embedded = tmp_path / gguf_mod.EMBEDDED_FILE
    embedded.write_bytes(b"GGUF")
    monkeypatch.setattr(gguf_mod, "embedded_gguf", lambda: embedded)
    monkeypatch.setenv(adapter_mod.ENV_SWITCH, "1")
    return embedded, converted, shipped


def test_the_embedded_model_is_served_merged(setup):
    embedded, converted, shipped = setup
    merged = adapter_mod.for_embedded(embedded, converted, shipped)
    assert merged != converted and merged.parent == converted.parent
    assert (merged / adapter_mod.MARKER).is_file() and (merged / "tokenizer.json").is_file()
    assert (merged / "model.safetensors").read_bytes() != (converted / "model.safetensors").read_bytes()
    stamp = (merged / "model.safetensors").stat().st_mtime_ns
    assert adapter_mod.for_embedded(embedded, converted, shipped) == merged  # built once, reused
    assert (merged / "model.safetensors").stat().st_mtime_ns == stamp


def test_other_files_the_switch_and_a_missing_adapter_keep_the_base(setup, tmp_path, monkeypatch):
    embedded, converted, shipped = setup
    other = tmp_path / "Other.Q8_0.gguf"
    other.write_bytes(b"GGUF")
    assert adapter_mod.for_embedded(other, converted, shipped) == converted
    assert adapter_mod.for_embedded(embedded, converted, tmp_path / "absent") == converted
    monkeypatch.setenv(adapter_mod.ENV_SWITCH, "0")
    assert adapter_mod.for_embedded(embedded, converted, shipped) == converted
    monkeypatch.delenv(adapter_mod.ENV_SWITCH)  # on by default: unset serves the tuned model
    assert adapter_mod.for_embedded(embedded, converted, shipped) != converted


def test_an_adapter_for_another_shape_is_refused(setup, tmp_path):
    embedded, converted, shipped = setup
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(shipped / "adapter_model.safetensors"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text((shipped / "adapter_config.json").read_text())
    save_file({k: v[:, :-1].contiguous() if "lora_A" in k else v for k, v in tensors.items()},
              str(bad / "adapter_model.safetensors"))  # fmt: skip
    with pytest.raises(ValueError, match="adapter delta for"):
        adapter_mod.merge(converted, bad, tmp_path / "out")
