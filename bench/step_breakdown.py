"""--by-batch: where a timed run's steps go, grouped by kind: decode steps by batch size, and steps with
prefill chunks. Per group: the steps, the host's wall time inside step(), the device time between the
starts of consecutive steps (CUDA: an event queued at each step's start; what the device spent on the
work queued in between, idle time included) and the time the step's K/V context would take to stream
at a given bandwidth (the decode attention's floor)."""

from __future__ import annotations

import time

from bench.step_timers import StepTimers

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)


def bucket(num_seqs: int, num_decodes: int) -> str:
    """A step's group: 'with prefill' when it has prefill chunks, else 'decode <= N' (N from BUCKETS)."""
    if num_decodes < num_seqs:
        return "with prefill"
    top = next((b for b in BUCKETS if num_seqs <= b), None)
    return f"decode <= {top:3d}" if top is not None else f"decode > {BUCKETS[-1]}"


class StepBreakdown:
    def __init__(self, core, enabled: bool, kv_bytes_per_token: int, bytes_per_s: float) -> None:
        self.core = core
        self.enabled = enabled
        self.kv_bytes_per_token = kv_bytes_per_token
        self.bytes_per_s = bytes_per_s
        self.rows: list[tuple[float, object, tuple[str, int] | None]] = []  # (wall, start event, step)
        self.end = None
        self.timers = StepTimers()  # holds the wrapped methods until __exit__

    def __enter__(self):
        if not self.enabled:
            return self
        cuda = self.core.device.type == "cuda"
        current: dict[str, tuple[str, int] | None] = {"step": None}

        def scheduled(schedule):
            def wrapped():
                batch = schedule()
                if batch:
                    new = batch.num_new_tokens
                    context = sum(s.num_computed_tokens + n for s, n in zip(batch.seqs, new, strict=True))
                    current["step"] = (bucket(len(batch.seqs), batch.num_decodes), context)
                return batch

            return wrapped

        def timed(step):
            def wrapped():
                current["step"] = None  # a step launched ahead by the previous one schedules nothing here
                event = _event() if cuda else None
                t0 = time.perf_counter()
                out = step()
                self.rows.append((time.perf_counter() - t0, event, current["step"]))
                return out

            return wrapped

        self.timers.replace(self.core.scheduler, "schedule", scheduled)
        self.timers.replace(self.core, "step", timed)
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.timers.restore()
            if self.core.device.type == "cuda":
                self.end = _event()

    def groups(self) -> dict[str, list[float]]:
        """group -> [steps, host s, device s (CUDA, else host), K/V streaming s]."""
        out: dict[str, list[float]] = {}
        for i, (wall, event, step) in enumerate(self.rows):
            if event is not None:
                nxt = self.rows[i + 1][1] if i + 1 < len(self.rows) else self.end
                device = event.elapsed_time(nxt) / 1e3
            else:
                device = wall
            name, context = step if step is not None else ("(launched ahead)", 0)
            g = out.setdefault(name, [0, 0.0, 0.0, 0.0])
            g[0] += 1
            g[1] += wall
            g[2] += device
            g[3] += context * self.kv_bytes_per_token / self.bytes_per_s
        return out

    def report(self) -> None:
        if not self.enabled:
            return
        if self.end is not None:
            import torch

            torch.cuda.synchronize()
        print(f"steps by kind: {'group':16s} {'steps':>6s} {'host s':>8s} {'device s':>9s} "
              f"{'K/V s':>7s} {'ms/step':>8s}  (K/V s: the steps' contexts read at "
              f"{self.bytes_per_s / 1e12:.2f} TB/s)")  # fmt: skip
        for name, (n, host, device, kv) in sorted(self.groups().items()):
            cells = f"{n:6d} {host:8.3f} {device:9.3f} {kv:7.3f} {device / n * 1e3:8.3f}"
            print(f"steps by kind: {name:16s} {cells}")


def _event():
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event
