"""What the benchmarks print with --timeline and --profile: the host's wall time per step part, the
GPU's busy and idle time around each step's forward and sampling, and profiler tables."""

from __future__ import annotations

import time


class HostTimeline:
    """--timeline: wall time the host spends in each part of a step, without a profiler's overhead
    (timers wrapped around the engine's step parts; blocking waits show up where they happen)."""

    PARTS = (
        ("scheduler", "schedule"),
        ("runner", "prepare"),
        ("runner", "execute"),
        ("runner", "run"),
        ("runner", "run_sampled"),
        ("core", "_sample"),
        ("core", "_reserve"),
        ("core", "_launched"),
        ("core", "_finish"),
        ("core", "_accept"),
        ("sampler", "process"),
        ("sampler", "sample"),
        ("staging", "upload"),
        ("scheduler", "after_step"),
    )

    def __init__(self, core, enabled: bool) -> None:
        from bench.step_timers import StepTimers

        self.core = core
        self.enabled = enabled
        self.timers = StepTimers(time.perf_counter)
        self.gaps: GpuGaps | None = None

    def __enter__(self):
        if self.enabled:
            wrap = self.timers.wrap
            owners = {
                "core": self.core,
                "runner": self.core.runner,
                "scheduler": self.core.scheduler,
                "sampler": self.core.sampler,
                "staging": self.core.runner._staging,
            }
            for owner, name in self.PARTS:
                if owners[owner] is not None:
                    wrap(owners[owner], name, f"{owner}.{name}")
            if self.core.device.type == "cuda":
                import torch

                wrap(torch.cuda.Event, "synchronize", "Event.synchronize")
            for graphs in _graph_sets(self.core.runner):
                wrap(graphs, "run", f"{type(graphs).__name__}.run")
                for graph, _ in _all_graphs(graphs):
                    wrap(graph, "replay", "CUDAGraph.replay")
            if self.core.device.type == "cuda":
                self.gaps = GpuGaps(self.core, self.timers)
        return self

    def __exit__(self, *exc) -> None:
        self.timers.restore()

    def report(self, wall: float, steps: int) -> None:
        if not self.enabled:
            return
        steps = max(steps, 1)
        totals = self.timers.totals
        cells = ", ".join(f"{k} {v / steps * 1e6:.0f}" for k, v in sorted(totals.items()))
        print(f"host timeline (us per step, wall {wall / steps * 1e6:.0f}): {cells}")
        if self.gaps is not None:
            self.gaps.report(steps)


def _graph_sets(runner) -> list:
    """The runner's graph holders (DecodeGraphs, ExtendGraphs, BatchGraphs) that exist."""
    return [g for g in (runner.graphs, runner.extend_graphs, runner.batch_graphs) if g is not None]


def _all_graphs(graphs) -> list:
    """(graph, output) of every graph a DecodeGraphs, ExtendGraphs or BatchGraphs holds."""
    return list(graphs.graphs.values()) + list(getattr(graphs, "step_graphs", {}).values())


class GpuGaps:
    """The GPU's side of a step, from CUDA events the host queues between its parts: a forward's start
    (runner.run), the replay of its graph, its end; after the next step's inputs are uploaded
    (runner.prepare), after the sampling launches (sampler.sample) and after the tokens' copy to the
    host (core._launched). Each span is the GPU time between two consecutive marks: the work queued
    between them, or idle time where the host queued the later one late."""

    def __init__(self, core, timers) -> None:
        import torch

        self.marks: list[tuple[str, torch.cuda.Event]] = []

        def mark(kind: str):
            def record() -> None:
                event = torch.cuda.Event(enable_timing=True)
                event.record()
                self.marks.append((kind, event))

            return record

        timers.around(core.runner, "run", mark("forward"), mark("forward end"))
        timers.around(core.runner, "run_sampled", mark("forward"), mark("sampled"))
        timers.around(core.runner, "prepare", after=mark("prepared"))
        timers.around(core.sampler, "sample", after=mark("sampled"))
        timers.around(core, "_launched", after=mark("tokens"))
        for graphs in _graph_sets(core.runner):
            for graph, _ in _all_graphs(graphs):
                timers.around(graph, "replay", mark("replay"))

    def report(self, steps: int) -> None:
        import torch

        torch.cuda.synchronize()
        spans: dict[str, list[float]] = {}
        for (a, ea), (b, eb) in zip(self.marks, self.marks[1:], strict=False):
            spans.setdefault(f"{a} -> {b}", []).append(ea.elapsed_time(eb) * 1e3)
        ranked = sorted(spans.items(), key=lambda kv: -sum(kv[1]))
        cells = ", ".join(f"{k} {sum(v) / steps:.0f} ({len(v)} x {sum(v) / len(v):.0f})" for k, v in ranked)
        print(f"gpu timeline (us per step, between events queued by the host; (spans x mean us)): {cells}")


class Profile:
    """--profile: where a timed run spends its time (python functions, GPU kernels vs wall)."""

    def __init__(self, enabled: bool, trace: str | None = None) -> None:
        self.enabled = enabled or trace is not None
        self.trace = trace  # also write the profiler's Chrome trace here

    def __enter__(self):
        if self.enabled:
            import cProfile

            import torch

            self.cprof = cProfile.Profile()
            self.torch_prof = None
            if torch.cuda.is_available():
                acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
                self.torch_prof = torch.profiler.profile(activities=acts)
                self.torch_prof.__enter__()
            self.cprof.enable()
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.cprof.disable()
            if self.torch_prof is not None:
                self.torch_prof.__exit__(None, None, None)

    def report(self, wall: float, steps: int) -> None:
        if not self.enabled:
            return
        import io
        import pstats

        buf = io.StringIO()
        pstats.Stats(self.cprof, stream=buf).sort_stats("tottime").print_stats(25)
        print(buf.getvalue())
        if self.torch_prof is not None:
            events = self.torch_prof.key_averages()
            gpu_us = sum(getattr(e, "self_device_time_total", 0) for e in events)
            print(events.table(sort_by="self_device_time_total", row_limit=25))
            print(kernel_gaps(_kernel_spans(self.torch_prof)))
            if self.trace:
                self.torch_prof.export_chrome_trace(self.trace)
                print(f"profile: Chrome trace written to {self.trace}")
            print(
                f"profile: wall {wall * 1e3:.1f} ms over {steps} steps "
                f"= {wall / max(steps, 1) * 1e3:.3f} ms/step; "
                f"GPU kernels {gpu_us / 1e3:.1f} ms = {gpu_us / 1e3 / max(steps, 1):.3f} ms/step "
                f"({gpu_us / 1e6 / wall:.0%} of wall)"
            )
        elif self.trace:
            print(f"profile: no CUDA device, so no GPU trace: {self.trace} not written")


def _kernel_spans(torch_prof) -> list[tuple[int, int, str]]:
    """(start, end in ns, name) of every GPU kernel the profiler saw (graph replays' kernels included)."""
    try:
        events = torch_prof.profiler.kineto_results.events()
    except AttributeError:  # a profiler without kineto results
        return []
    spans = []
    for e in events:
        if "CUDA" in str(e.device_type()) and not e.name().startswith("Memcpy"):
            spans.append((e.start_ns(), e.start_ns() + e.duration_ns(), e.name()))
    return sorted(spans)


GAP_EDGES_US = (1, 2, 5, 20, 100)


def kernel_gaps(spans: list[tuple[int, int, str]], top: int = 8) -> str:
    """The GPU's idle time between consecutive kernels, by gap length (launch gaps inside a step, a few
    us each, apart from the host's, tens of us and more) and by the kernel that ends each gap."""
    if not spans:
        return "kernel gaps: no kernel spans recorded"
    edges = GAP_EDGES_US
    busy_end, busy = spans[0][0], 0
    bins = [[0, 0.0] for _ in range(len(edges) + 1)]
    before: dict[str, float] = {}  # idle us before each kernel name, gaps under the last edge
    for start, end, name in spans:
        if start > busy_end:
            gap = (start - busy_end) / 1e3
            b = sum(gap >= edge for edge in edges)
            bins[b][0] += 1
            bins[b][1] += gap
            if gap < edges[-1]:
                before[name] = before.get(name, 0.0) + gap
        busy += max(0, end - max(start, busy_end))
        busy_end = max(busy_end, end)
    span_ms = (busy_end - spans[0][0]) / 1e6
    labels = (
        [f"<{edges[0]}"]
        + [f"{a}-{b}" for a, b in zip(edges[:-1], edges[1:], strict=True)]
        + [f">={edges[-1]}"]
    )
    cells = ", ".join(
        f"{lab} us: {n} gaps {t / 1e3:.1f} ms" for lab, (n, t) in zip(labels, bins, strict=True) if n
    )
    ranked = sorted(before.items(), key=lambda kv: -kv[1])[:top]
    names = "; ".join(f"{t / 1e3:.1f} ms before {name[:60]}" for name, t in ranked)
    return (
        f"kernel gaps: {len(spans)} kernels over {span_ms:.1f} ms, busy {busy / 1e6:.1f} ms "
        f"({busy / 1e6 / max(span_ms, 1e-9):.0%}); idle by gap length: {cells}\n"
        f"kernel gaps under {edges[-1]} us, by the kernel after them: {names}"
    )


class NewKernels:
    """Records the Triton kernel variants first met in this process while the block runs (each is
    compiled, or loaded from Triton's disk cache: milliseconds to a second inside a timed run). A
    benchmark's warm-up should leave none for its timed run."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.recording = False
        self._runtime = self._previous = None

    def __enter__(self) -> NewKernels:
        try:
            from triton import knobs
        except ImportError:  # no triton, or one without knobs: nothing recorded
            return self
        runtime = knobs.runtime
        if not hasattr(runtime, "jit_cache_hook"):
            return self
        previous = runtime.jit_cache_hook

        def hook(*args, **kwargs):
            self.names.append(getattr(kwargs.get("fn"), "name", "?"))
            return previous(*args, **kwargs) if previous is not None else None

        self._runtime, self._previous, self.recording = runtime, previous, True
        runtime.jit_cache_hook = hook
        return self

    def __exit__(self, *exc) -> None:
        if self._runtime is not None:
            self._runtime.jit_cache_hook = self._previous
            self._runtime = None

    def summary(self) -> str:
        head = "Triton kernel variants first met during the timed run:"
        if not self.recording:
            return f"{head} not recorded (this Triton has no jit_cache_hook)"
        counts: dict[str, int] = {}
        for name in self.names:
            counts[name] = counts.get(name, 0) + 1
        listed = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in sorted(counts.items()))
        return f"{head} {len(self.names)}" + (f" ({listed})" if listed else "")
