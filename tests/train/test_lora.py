"""The LoRA fine-tune on the CPU: a few steps on generated data make the loss fall, a rerun resumes
from the checkpoint, the exported fp16 adapter merges into weights that give the peft model's logits."""

from __future__ import annotations

import json

import pytest
import torch

from train import lora

ARGS = ["--examples", "8", "--batch-size", "4", "--max-len", "512", "--layers-from", "0", "--lr", "3e-2"]
ARGS += ["--warmup", "1", "--rank", "16", "--alpha", "32", "--save-every", "50", "--fp32", "--device", "cpu"]

# peft asks transformers a deprecated question (transformers 5.24)
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")


def test_loss_falls_and_training_resumes(tiny_llama, tmp_path):
    out = tmp_path / "run"
    # the same 2 batches again and again (8 examples, batch 4): the loss on them must fall
    first = lora.main(["--out", str(out), "--model", str(tiny_llama), "--max-steps", "4", *ARGS])
    assert first["step"] == 4 and (out / "loss.png").stat().st_size > 1000
    state = lora.main(["--out", str(out), "--model", str(tiny_llama), "--max-steps", "20", *ARGS])
    assert state["step"] == 20 and state["losses"][:4] == first["losses"]  # resumed, not restarted
    losses = state["losses"]
    # a random 2-layer model starts at ln(49152) = 10.8 nats; a few LoRA steps already move it
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.1, losses
    assert state["target_tokens"] > 0 and state["tokens"] > state["target_tokens"]


def test_exported_adapter_merges_into_the_same_model(tiny_llama, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from models.adapter import merge

    out = tmp_path / "run"
    lora.main(["--out", str(out), "--model", str(tiny_llama), "--max-steps", "2", *ARGS])
    shipped = tmp_path / "adapter"
    lora.main(["--out", str(out), "--export", str(shipped)])
    assert json.loads((shipped / "recipe.json").read_text())["step"] == 2
    merged = merge(tiny_llama, shipped, tmp_path / "merged")

    ids = torch.tensor([[1, 500, 900, 33, 4000, 2]])
    base = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    with torch.no_grad():
        before = base(ids).logits
        peft = PeftModel.from_pretrained(base, shipped)
        want = peft(ids).logits
        got = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)(ids).logits
    assert not torch.allclose(before, want, atol=1e-4)  # the adapter changes the model
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-3)
