"""runner.cpu_step: a quantized model's compiled CPU decode step gives the eager step's greedy tokens."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams

# lengths around the 16-token block: a one-block context runs on two blocks, the second masked
PROMPTS = [[5, 9, 200, 31], list(range(300, 321)), [7] * 40]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def _tokens(path, **kwargs) -> tuple[list[list[int]], list[int], object]:
    llm = LLM(str(path), device="cpu", num_kv_blocks=64, num_threads=1, **kwargs)
    batch = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    single = llm.generate([PROMPTS[1]], GREEDY)[0].outputs[0].token_ids
    return batch, single, llm.core.runner.cpu_step


def _check(path, mode: str) -> None:
    want_batch, want_single, eager = _tokens(path, quantization=mode, cpu_compile=False)
    got_batch, got_single, step = _tokens(path, quantization=mode)  # None: on for a quantized model
    assert eager is None and step is not None and step.compile_seconds > 0
    assert got_batch == want_batch and got_single == want_single


def test_int8_compiled_step_matches_eager(checkpoint_factory):
    _check(checkpoint_factory("llama"), "int8")


@pytest.mark.heavy  # two more compiles
def test_int4_compiled_step_matches_eager(checkpoint_factory):
    _check(checkpoint_factory("llama"), "int4")


def test_float32_and_unsupported_models_stay_eager(checkpoint_factory):
    llm = LLM(str(checkpoint_factory("llama")), device="cpu", num_kv_blocks=16, cpu_compile=True)
    assert llm.core.runner.cpu_step is None  # float32 weights: the exact eager path
    llm = LLM(str(checkpoint_factory("qwen3")), device="cpu", num_kv_blocks=16, quantization="int8")
    assert llm.core.runner.cpu_step is None  # q/k norms
    with pytest.raises(ValueError, match="cpu_compile"):
        LLM(str(checkpoint_factory("llama")), device="cpu", cpu_compile="yes")
