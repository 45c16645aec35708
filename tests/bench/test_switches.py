"""`chatloom bench --set module.NAME=value`: what it accepts, what it refuses before anything runs."""

from __future__ import annotations

import sys

import pytest

from bench import switches as bench_switches
from bench import workloads as bench
from kernels import decode_launch, pdl


def test_parse():
    parsed = bench_switches.parse("kernels.pdl.PDL=False")
    assert parsed == ("kernels.pdl", "PDL", False)
    assert bench_switches.parse(" kernels.decode_launch.TABLE_REGS_MAX = 2") == (
        "kernels.decode_launch", "TABLE_REGS_MAX", 2,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("PDL=False", "module.NAME=value"),
        ("kernels.pdl.PDL", "module.NAME=value"),
        ("os.SEP='x'", "only switches of"),
        ("kernels.dispatch.use_triton=1", "UPPER_CASE"),
        ("kernels.pdl.PDL=yes", "Python literal"),
        ("kernels.nope.X=1", "no module"),
        ("kernels.dispatch.PDX=False", "has no PDX"),
        ("kernels.pdl.PDL=1", "holds a bool, got a int"),
    ],
)
def test_refusals(spec, message):
    with pytest.raises(ValueError, match=message):
        bench_switches.apply([spec])


def test_apply_sets_all_or_nothing(monkeypatch):
    monkeypatch.setattr(pdl, "PDL", True)
    monkeypatch.setattr(decode_launch, "PEEL_STAGES", 1)
    monkeypatch.setattr(decode_launch, "TABLE_REGS_MAX", 512)
    bad = ["kernels.pdl.PDL=False", "kernels.decode_launch.PEEL_STAGES=2.5"]
    with pytest.raises(ValueError):  # the second is wrong: the first is not set either
        bench_switches.apply(bad)
    assert pdl.PDL is True
    specs = ["kernels.decode_launch.PEEL_STAGES=2", "kernels.decode_launch.TABLE_REGS_MAX=2"]
    done = bench_switches.apply(specs)
    assert done == {
        "kernels.decode_launch.PEEL_STAGES": 2,
        "kernels.decode_launch.TABLE_REGS_MAX": 2,
    }
    assert decode_launch.PEEL_STAGES == 2 and decode_launch.TABLE_REGS_MAX == 2


def test_apply_sets_the_running_program_when_it_is_the_module(monkeypatch):
    # `python -m bench.w2_attention --set bench.w2_attention.X=...`: the program runs as __main__,
    # whose globals its functions read; the module imported by name is another copy
    import types

    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name="bench.w2_attention")
    main.BLOCK_SIZE = 8
    monkeypatch.setitem(sys.modules, "__main__", main)
    from bench import w2_attention as bench_w2

    imported = bench_w2.BLOCK_SIZE
    assert bench_switches.apply(["bench.w2_attention.BLOCK_SIZE=64"]) == {"bench.w2_attention.BLOCK_SIZE": 64}
    assert main.BLOCK_SIZE == 64 and bench_w2.BLOCK_SIZE == imported != 64
    monkeypatch.setattr(pdl, "PDL", True)  # another module is still set by import
    bench_switches.apply(["kernels.pdl.PDL=False"])
    assert pdl.PDL is False


def test_bench_refuses_a_bad_switch_before_running(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--workload", "w3", "--set", "kernels.dispatch.PDX=False"])
    assert exit_info.value.code == 2
    assert "has no PDX" in capsys.readouterr().err


def test_max_model_len_option():
    """W1-W3 run at benchmarks.md's 4,096-token context limit unless told otherwise (the graphs' block
    tables are sized by it: 40,960 gives the wide tables that hold part of a row in registers)."""
    parser = bench.build_parser()
    assert parser.parse_args(["--workload", "w2"]).max_model_len == 4096
    assert parser.parse_args(["--workload", "w2", "--max-model-len", "40960"]).max_model_len == 40960
