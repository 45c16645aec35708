"""The shipped tool-use adapter, merged into the embedded SmolLM2, on a small held-out sample through
the OpenAI API (tool_choice auto, grammar on): above the issue's thresholds. A few dozen requests."""

from __future__ import annotations

import pytest

from models.adapter import SHIPPED
from train import eval_tools


@pytest.mark.slow
@pytest.mark.heavy  # xfail while the adapter is below target: `make test-all`
@pytest.mark.xfail(reason="issue 44: the shipped adapter is below the thresholds (docs/performance.md)")
def test_the_tuned_model_calls_held_out_tools_by_itself(smollm2_dir):
    if not (SHIPPED / "adapter_model.safetensors").is_file():
        pytest.skip("no adapter ships in models/adapters/smollm2_tools")
    (row,) = eval_tools.evaluate(["tuned"], [True], seed=99, calls=14, abstain=6, answers=6, plain=0)
    rates = row["rates"]
    shown = eval_tools.table([row]) + "\n" + "\n".join(map(str, row["failures"]))
    for metric, floor in eval_tools.TARGETS.items():
        assert rates[metric] >= floor, shown
