"""`chatloom bench --set module.NAME=value`: what it accepts, what it refuses before anything runs."""

from __future__ import annotations

import pytest

from engine import bench, bench_switches
from kernels import decode_tail, dispatch, paged_attention


def test_parse():
    parsed = bench_switches.parse("kernels.dispatch.DECODE_LAYER=True")
    assert parsed == ("kernels.dispatch", "DECODE_LAYER", True)
    assert bench_switches.parse(" kernels.paged_attention.MID_BATCH_SPLITS = 2") == (
        "kernels.paged_attention", "MID_BATCH_SPLITS", 2,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("DECODE_LAYER=True", "module.NAME=value"),
        ("kernels.dispatch.DECODE_LAYER", "module.NAME=value"),
        ("os.SEP='x'", "only switches of"),
        ("kernels.dispatch.use_triton=1", "UPPER_CASE"),
        ("kernels.dispatch.DECODE_LAYER=yes", "Python literal"),
        ("kernels.nope.X=1", "no module"),
        ("kernels.dispatch.DECODE_LAYR=True", "has no DECODE_LAYR"),
        ("kernels.dispatch.DECODE_LAYER=1", "holds a bool, got a int"),
    ],
)
def test_refusals(spec, message):
    with pytest.raises(ValueError, match=message):
        bench_switches.apply([spec])


def test_apply_sets_all_or_nothing(monkeypatch):
    monkeypatch.setattr(dispatch, "DECODE_LAYER", False)
    monkeypatch.setattr(decode_tail, "L2_PREFETCH", False)
    monkeypatch.setattr(paged_attention, "MID_BATCH_SPLITS", 1)
    with pytest.raises(ValueError):  # the second is wrong: the first is not set either
        bench_switches.apply(["kernels.dispatch.DECODE_LAYER=True", "kernels.decode_tail.L2_PREFETCH=2"])
    assert dispatch.DECODE_LAYER is False
    specs = ["kernels.decode_tail.L2_PREFETCH=True", "kernels.paged_attention.MID_BATCH_SPLITS=2"]
    done = bench_switches.apply(specs)
    assert done == {"kernels.decode_tail.L2_PREFETCH": True, "kernels.paged_attention.MID_BATCH_SPLITS": 2}
    assert decode_tail.L2_PREFETCH is True and paged_attention.MID_BATCH_SPLITS == 2


def test_bench_refuses_a_bad_switch_before_running(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--workload", "w3", "--set", "kernels.dispatch.DECODE_LAYR=True"])
    assert exit_info.value.code == 2
    assert "has no DECODE_LAYR" in capsys.readouterr().err
