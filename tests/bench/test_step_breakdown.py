"""--by-batch: every step of a run lands in one group, by kind and decode batch size."""

from __future__ import annotations

from bench.step_breakdown import StepBreakdown, bucket
from engine import LLM, SamplingParams


def test_bucket():
    assert bucket(5, 5) == "decode <=   8" and bucket(1, 1) == "decode <=   1"
    assert bucket(256, 256) == "decode <= 256" and bucket(300, 300) == "decode > 256"
    assert bucket(4, 3) == "with prefill"


def test_steps_grouped_by_kind(tiny_qwen3):
    llm = LLM(tiny_qwen3, device="cpu", dtype="float32", num_kv_blocks=64, max_num_batched_tokens=64)
    prompts = [[i + 1] * (10 + 20 * i) for i in range(4)]
    params = [SamplingParams(temperature=0, max_tokens=2 + 3 * i, ignore_eos=True) for i in range(4)]
    steps0 = llm.core.num_steps
    with StepBreakdown(llm.core, True, kv_bytes_per_token=1000, bytes_per_s=1e6) as by_batch:
        llm.generate(prompts, params)
    groups = by_batch.groups()
    assert sum(g[0] for g in groups.values()) == llm.core.num_steps - steps0
    assert groups["with prefill"][0] >= 2  # 160 prompt tokens at 64 a step
    assert groups["decode <=   1"][0] >= 1  # the longest request decodes alone at the end
    for _, host, device, kv in groups.values():
        assert host > 0 and device == host and kv > 0  # on the CPU the device time is the host's
    # each step's K/V floor: its sequences' contexts (incl. the new tokens) at the given rate
    one = groups["decode <=   1"]
    assert one[3] / one[0] > 1000 * (10 + 20 * 3) / 1e6
    by_batch.report()
    assert llm.core.scheduler.schedule.__name__ == "schedule"  # unwrapped on exit
