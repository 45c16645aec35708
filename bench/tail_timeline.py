"""Where the one-launch decode layer tail spends its time (`python -m bench.tail_timeline`, CUDA only).

Each program of a traced launch (kernels.decode_tail, TRACE) writes the GPU's global nanosecond clock at
its start and, for each stage, once its input is read, at the stage's end (every warp past its stores)
and at its exit from the grid barrier after it. Printed per point: the earliest, median and latest
program, in microseconds after the earliest start (medians over the repetitions), with the weights
streamed from HBM (the traced layer's weights last read seven layers before) and with them resident in
L2 (the same layer run twice).
"""

from __future__ import annotations

import argparse
import statistics

import torch

POINTS = ("start", "1 (o) input read", "1 end", "barrier 1 exit", "2 (gate_up) input read", "2 end",
          "barrier 2 exit", "3 (down) input read", "3 end", "barrier 3 exit", "4 (qkv) input read",
          "4 end")  # fmt: skip


def _inputs(dtype, device, copies: int):
    from bench.kernels import HEAD_DIM, HIDDEN, NUM_HEADS, _randn, tail_layers

    a = _randn(1, NUM_HEADS * HEAD_DIM, dtype=dtype, device=device)
    res = _randn(1, HIDDEN, dtype=dtype, device=device)
    return tail_layers(dtype, device, copies), a, res


def timeline(dtype=torch.bfloat16, reps: int = 20, copies: int = 8, tma: bool = False
             ) -> tuple[int, dict[str, list[tuple]]]:  # fmt: skip
    """(programs, {"HBM" | "L2": [(point, earliest, median, latest) in us]}) at the Qwen3-0.6B shapes;
    tma: kernels.decode_tail_tma's launch (its own points) instead of kernels.decode_tail's."""
    if tma:
        from kernels.decode_tail_tma import POINTS as points
        from kernels.decode_tail_tma import decode_layer_tail
    else:
        from kernels.decode_tail import TRACE_POINTS, decode_layer_tail

        points = POINTS
        assert len(POINTS) == TRACE_POINTS.value
    device = torch.device("cuda")
    ws, a, res = _inputs(dtype, device, copies)
    trace = torch.zeros((4096, len(points)), dtype=torch.int64, device=device)
    out = {}
    for where, traced in (("HBM", 0), ("L2", copies - 1)):
        per_rep = []
        for _ in range(reps + 1):  # the first compiles
            for w in ws:
                decode_layer_tail(a, res, w)
            trace.zero_()
            decode_layer_tail(a, res, ws[traced], trace=trace)
            torch.cuda.synchronize()
            t = trace[trace[:, 0] > 0]
            per_rep.append(((t - t[:, 0].min()).double() / 1e3).cpu())
        per_rep = per_rep[1:]
        rows = []
        for i, point in enumerate(points):
            stats = [(float(t[:, i].min()), float(t[:, i].median()), float(t[:, i].max())) for t in per_rep]
            rows.append((point, *(statistics.median(s[j] for s in stats) for j in range(3))))
        out[where] = rows
    return int(per_rep[0].shape[0]), out


def main(argv: list[str] | None = None) -> int:
    summary = __doc__.split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bench.tail_timeline", description=summary)
    parser.add_argument("--reps", type=int, default=20, help="traced launches per case (medians over them)")
    from bench import switches as bench_switches

    bench_switches.add_option(parser, "flip a switch first, e.g. kernels.pdl.PDL=False")
    parser.add_argument("--tma", action="store_true", help="trace kernels.decode_tail_tma instead")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    switches = bench_switches.apply_or_exit(parser, args.set)
    if switches:
        print("switches: " + ", ".join(f"{k}={v}" for k, v in switches.items()))
    programs, cases = timeline(reps=args.reps, tma=args.tma)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {programs} programs on {sms} SMs (the stamps' CTA barriers cost registers: maybe fewer per SM)")
    for where, rows in cases.items():
        print(f"# decode layer tail, weights from {where}: us after the first program's start")
        print(f"{'point':<24} {'earliest':>9} {'median':>9} {'latest':>9}")
        for point, lo, mid, hi in rows:
            print(f"{point:<24} {lo:>9.2f} {mid:>9.2f} {hi:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
