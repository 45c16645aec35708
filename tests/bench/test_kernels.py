"""bench.kernels stays runnable: --help, and a tiny run through the interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch

from bench import kernels as bench


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--help"])
    assert exit_info.value.code == 0
    assert "--sweep" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the tiny CPU run is for machines without CUDA")
def test_tiny_cpu_run(capsys):
    assert bench.main(["--tiny", "--only", "store_kv,bitmask,rms_norm", "--reps", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.split()[0] in ("store_kv", "bitmask", "rms_norm")]
    assert len(rows) == 3
    assert all(float(row[-1]) < 1e-5 for row in rows)  # err column vs the reference


@pytest.mark.skipif(torch.cuda.is_available(), reason="the tiny CPU run is for machines without CUDA")
@pytest.mark.slow
@pytest.mark.heavy  # a bench smoke (~12 s): `make test-all`
def test_tiny_cpu_sweep_covers_the_fused_decode_launch(capsys):
    assert bench.main(["--tiny", "--sweep", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    assert "fused decode B=1 ctx=64: engine splits" in out and "best (16, 4, 1)/" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the tiny CPU run is for machines without CUDA")
def test_tiny_cpu_sweep_of_prefill_only_with_a_switch_set(capsys, monkeypatch):
    from kernels import decode_launch

    monkeypatch.setattr(decode_launch, "PEEL_STAGES", 1)  # restored after the run sets it
    switch = "kernels.decode_launch.PEEL_STAGES=2"
    assert bench.main(["--tiny", "--sweep", "--only", "prefill", "--reps", "1", "--set", switch]) == 0
    assert decode_launch.PEEL_STAGES == 2
    out = capsys.readouterr().out
    assert "# set kernels.decode_launch.PEEL_STAGES = 2" in out and "prefill 2x16 ctx=16: best" in out
    assert "decode" not in out.split("\n", 1)[1]  # past the set line: neither decode sweep ran


@pytest.mark.skipif(torch.cuda.is_available(), reason="the tiny CPU run is for machines without CUDA")
@pytest.mark.slow
@pytest.mark.heavy  # CI keeps the fused-decode sweep; `make test-all` runs this
def test_tiny_cpu_ragged_sweep_times_each_split_count(capsys):
    assert bench.main(["--tiny", "--sweep-ragged", "--reps", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    line = next(x for x in out if x.startswith("ragged B=4"))
    assert "engine 1;" in line and " 1=" in line and " 2=" in line
    dispatch = next(x for x in out if x.strip().startswith("unsplit by dispatch:"))
    assert all(f"{name}=" in dispatch for name in ("rows", "longest-first"))
    assert any(x.startswith("# streaming read:") for x in out)


def test_unknown_kernel_is_rejected():
    with pytest.raises(SystemExit):
        bench.main(["--only", "nope"])


def test_tail_timeline_help_and_cpu_refusal(capsys):
    from bench import tail_timeline

    with pytest.raises(SystemExit) as exit_info:
        tail_timeline.main(["--help"])
    assert exit_info.value.code == 0
    assert "--set" in capsys.readouterr().out
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as exit_info:
            tail_timeline.main([])
        assert exit_info.value.code == 2
        assert "needs a CUDA device" in capsys.readouterr().err


def test_w2_replay_help_and_steps(capsys):
    from bench import w2_attention as bench_w2

    with pytest.raises(SystemExit) as exit_info:
        bench_w2.main(["--help"])
    assert exit_info.value.code == 0 and "--stride" in capsys.readouterr().out
    steps = bench_w2.w2_steps(100, tiny=False)
    assert [t for t, _, _ in steps][:3] == [0, 100, 200] and len(steps[0][1]) == 256  # every sequence decodes
    assert all(len(b) <= len(a) for (_, a, _), (_, b, _) in zip(steps, steps[1:], strict=False))  # shrink
    assert min(steps[0][1]) >= 101 and max(steps[-1][1]) <= 1024 + 1024  # prompt + step + 1, within W2's
    assert all(len(ctx) == len(rows) for _, ctx, rows in steps) and steps[0][2] == list(range(256))
    tables, used = bench_w2.engine_tables(tiny=False)
    blocks = sorted(b for t in tables for b in t)
    assert blocks == list(range(used))  # every block handed out once
    for _, ctx, rows in steps:
        room = bench_w2.BLOCK_SIZE
        assert all(len(tables[r]) * room >= c for r, c in zip(rows, ctx, strict=True))  # each context fits


@pytest.mark.skipif(torch.cuda.is_available(), reason="the tiny CPU run is for machines without CUDA")
@pytest.mark.slow
@pytest.mark.heavy  # CI keeps the fused-decode sweep; `make test-all` runs this
def test_w2_replay_tiny_cpu_run(capsys, monkeypatch):
    from bench import w2_attention as bench_w2
    from kernels import decode_launch

    assert bench_w2.main(["--tiny", "--layouts", "engine contiguous", "--new-token", "folded none"]) == 0
    out = capsys.readouterr().out
    heads = [line for line in out.splitlines() if line.startswith("# layout")]
    assert heads == [
        f"# layout {lay}, new token {nt}" for lay in ("engine", "contiguous") for nt in ("folded", "none")
    ]
    assert out.count("(16, 4, 1): W2 total") == 4 and "0:B2 " in out and "8:B1 " in out
    assert out.splitlines()[-1].startswith("best (16, 4, 1):")
    # with the qkv projection: cuBLAS's then the folded launch, or kernels.qkv_new_token then the walk
    assert bench_w2.main(["--tiny", "--layouts", "engine", "--new-token", "gemm epilogue"]) == 0
    out = capsys.readouterr().out
    assert "# layout engine, new token gemm" in out and "# layout engine, new token epilogue" in out
    assert out.count("(16, 4, 1): W2 total") == 2
    # tables as wide as a long max_model_len makes them, wider than the registers hold (part held)
    monkeypatch.setattr(decode_launch, "TABLE_REGS_MAX", 2)
    assert bench_w2.main(["--tiny", "--layouts", "engine", "--table-width", "40"]) == 0
    out = capsys.readouterr().out
    assert "# layout engine, new token fused, table width 40" in out and "(16, 4, 1): W2 total" in out
    with pytest.raises(SystemExit):
        bench_w2.main(["--tiny", "--new-token", "unfused"])
    assert "--new-token: unknown 'unfused'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a switch that does not exist stops it before anything runs
        bench_w2.main(["--tiny", "--set", "kernels.decode_launch.NO_SUCH=1"])
    assert "kernels.decode_launch has no NO_SUCH" in capsys.readouterr().err


def test_w2_replay_separate_equals_fused():
    """`--new-token separate` (qk_norm_rope_store_kv's launch, then the attention over the cache) computes
    what the fused launch does: the same output and cache rows."""
    from bench import w2_attention as bench_w2
    from bench.kernels import BLOCK_SIZE, HEAD_DIM, NUM_KV_HEADS, _new_token

    torch.manual_seed(0)
    ctx = [37, 5, 70]
    per_seq = -(-max(ctx) // BLOCK_SIZE)
    blocks = len(ctx) * per_seq + 1
    shape = (blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    pool = torch.randn(*shape), torch.randn(*shape)
    tables = torch.randperm(blocks)[: len(ctx) * per_seq].view(len(ctx), per_seq).int()
    seq_lens = torch.tensor(ctx, dtype=torch.int32)
    q, new = _new_token(seq_lens, tables, torch.float32, torch.device("cpu"))
    runs = []
    for separate in (False, True):
        caches = tuple(t.clone() for t in pool)
        out = bench_w2._attend(q.clone(), caches, tables, seq_lens, new, separate, None, per_seq * BLOCK_SIZE)
        runs.append((out, *caches))
    for a, b in zip(*runs, strict=True):
        assert (a - b).abs().max().item() < 2e-5


@pytest.mark.skipif(torch.cuda.is_available(), reason="the tiny CPU run is for machines without CUDA")
@pytest.mark.slow
@pytest.mark.heavy  # CI keeps the fused-decode sweep; `make test-all` runs this
def test_qkv_bench_tiny_cpu_run(capsys):
    """bench.qkv_configs: one cell a way of loading and configuration, each with its error against the
    reference; unknown ways are refused before anything runs."""
    from bench import qkv_configs as bench_qkv

    assert bench_qkv.main(["--tiny", "--loads", "pointers tma"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("rows 5: cuBLAS F.linear ")
    cells = line.split("  ")[1:]
    assert [c.split(" (16")[0] for c in cells] == ["pointers", "tma"]
    assert all(float(c.split("err ")[1].rstrip(")")) < 1e-4 for c in cells)
    assert bench_qkv.main(["--tiny"]) == 0  # the default build alone
    assert capsys.readouterr().out.count("(err ") == 1
    with pytest.raises(SystemExit):
        bench_qkv.main(["--tiny", "--loads", "bulk"])
    assert "--loads: unknown 'bulk'" in capsys.readouterr().err
