"""Teaching the embedded model (SmolLM2-135M-Instruct) to call tools by itself.

- `tool_bank.py`: the training tool domains (hand-written and procedural); `heldout.py`: the
  evaluation's tool sets, whose names and domains never occur in training.
- `generate.py`: seeded synthetic conversations, rendered through chatloom's own prompt renderer.
- `lora.py`: the LoRA fine-tune (peft), resumable, with a progress bar and a loss plot.
- `adapter.py`: the shipped adapter merged into the base weights at load.
- `eval_tools.py`: the held-out evaluation through chatloom's OpenAI API.
"""
