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
        from engine.step_timers import StepTimers

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
            for graphs in (self.core.runner.graphs, self.core.runner.extend_graphs):
                if graphs is not None:
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


def _all_graphs(graphs) -> list:
    """(graph, output) of every graph a DecodeGraphs or ExtendGraphs holds."""
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
        for graphs in (core.runner.graphs, core.runner.extend_graphs):
            if graphs is not None:
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

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

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
            print(events.table(sort_by="self_device_time_total", row_limit=15))
            print(
                f"profile: wall {wall * 1e3:.1f} ms over {steps} steps "
                f"= {wall / max(steps, 1) * 1e3:.3f} ms/step; "
                f"GPU kernels {gpu_us / 1e3:.1f} ms = {gpu_us / 1e3 / max(steps, 1):.3f} ms/step "
                f"({gpu_us / 1e6 / wall:.0%} of wall)"
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
