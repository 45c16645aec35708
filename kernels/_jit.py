"""`kernel` decorator: a Triton kernel that picks compiled or interpreted execution at launch.

`triton.jit` decides once, at decoration time, from TRITON_INTERPRET. That breaks when the module is
imported before a test sets the variable, and it can never run CUDA and CPU tensors in the same
process. Here the choice is made per launch: tensors on the CPU (or TRITON_INTERPRET=1) run through
Triton's interpreter, CUDA tensors through the compiled kernel.

Triton's own library functions (tl.sum, tl.max, ...) are themselves @triton.jit functions, fixed to
the compiled mode when triton was imported without TRITON_INTERPRET. A compiled JITFunction refuses
to be called from Python, so while one of our interpreted launches runs, calls to JITFunctions are
routed through an InterpretedFunction of the same source (`_route_jit_calls_to_interpreter`).

An interpreted launch patches triton.language's functions and classes with interpreter versions; some
Triton releases (3.6: a device function called from an interpreted kernel patches without restoring)
leave part of that patching in place afterwards, and a kernel compiled later in
the same process then fails to build (`'ir.value' object has no attribute 'dtype'`). Each interpreted
launch therefore puts triton.language back as it found it (`_LanguageSnapshot`).
"""

from __future__ import annotations

import contextlib
import os
import threading

import torch
import triton

# Triton 3.9 warns at every compile unless this is set; "1" keeps its current default (FMA fusion on).
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


def interpret_forced() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


_interpreting = threading.local()
_recording: list | None = None
_interpreted_helpers: dict = {}


def _route_jit_calls_to_interpreter() -> None:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if getattr(JITFunction, "_chatloom_routed", False):
        return
    original = JITFunction.__call__

    def call(self, *args, **kwargs):
        if not getattr(_interpreting, "active", False):
            return original(self, *args, **kwargs)
        helper = _interpreted_helpers.get(self.fn)
        if helper is None:
            helper = _interpreted_helpers[self.fn] = InterpretedFunction(self.fn)
        return helper(*args, **kwargs)

    JITFunction.__call__ = call
    JITFunction._chatloom_routed = True
    _fix_scalar_index()


def _fix_scalar_index() -> None:
    """Triton 3.6's interpreter turns a scalar tensor into a python int (a data-dependent `range` bound)
    with int() of a 1-element 1-d array, an error in NumPy >= 2.4; later Tritons squeeze first. Every
    interpreted launch re-patches the language, so the fix wraps the patching function."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._patch_lang

    def patch_lang(fn):
        scope = original(fn)
        to_int = lambda self: int(np.asarray(self.handle.data).reshape(-1)[0])
        scope.set_attr(tl.core.tensor, "__index__", to_int)
        return scope

    interpreter._patch_lang = patch_lang


class _LanguageSnapshot:
    """The attributes of triton.language's modules and of the classes they define, taken before an
    interpreted launch and put back after it. Names the launch added stay: the interpreter adds
    helpers it expects to find again (its semantic object), which compiled kernels never look up."""

    def __init__(self) -> None:
        import sys

        modules = list(sys.modules.items())
        owners: list = [m for name, m in modules if name.startswith("triton.language") and m]
        owners += [
            v
            for m in list(owners)
            for v in list(vars(m).values())
            if isinstance(v, type) and getattr(v, "__module__", "").startswith("triton.language")
        ]
        self._saved = [(o, dict(vars(o))) for o in dict.fromkeys(owners)]

    def restore(self) -> None:
        for owner, saved in self._saved:
            now = vars(owner)
            for name, value in saved.items():
                if now.get(name) is not value:
                    with contextlib.suppress(AttributeError, TypeError):
                        setattr(owner, name, value)


class Kernel:
    def __init__(self, fn, **jit_kwargs):
        self.fn = fn
        self.jit_kwargs = jit_kwargs
        self._compiled = None
        self._interpreted = None

    def _pick(self, args, kwargs):
        on_cpu = any(
            isinstance(a, torch.Tensor) and a.device.type == "cpu" for a in (*args, *kwargs.values())
        )
        if on_cpu or interpret_forced():
            if self._interpreted is None:
                from triton.runtime.interpreter import InterpretedFunction

                self._interpreted = InterpretedFunction(self.fn, **self.jit_kwargs)
            return self._interpreted
        if self._compiled is None:
            from triton.runtime.jit import JITFunction

            self._compiled = JITFunction(self.fn, **self.jit_kwargs)
        return self._compiled

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            if _recording is not None:
                _recording.append((self.fn, grid, args, kwargs))
                return None
            fn = self._pick(args, kwargs)
            if fn is self._compiled:
                return fn[grid](*args, **kwargs)
            _route_jit_calls_to_interpreter()
            snapshot = _LanguageSnapshot()
            _interpreting.active = True
            try:
                return fn[grid](*args, **kwargs)
            finally:
                _interpreting.active = False
                snapshot.restore()

        return launch

    def warmup(self, grid, *args, **kwargs):
        """Compiles (without launching) for these CUDA arguments; returns Triton's compiled kernel."""
        return self._pick(args, kwargs).warmup(*args, grid=grid, **kwargs)


def kernel(fn=None, **jit_kwargs):
    if fn is None:
        return lambda f: Kernel(f, **jit_kwargs)
    return Kernel(fn, **jit_kwargs)


@contextlib.contextmanager
def record_launches():
    """Within this block launches are recorded as (python fn, grid, args, kwargs) instead of run, and
    launchers pick their GPU configurations even for CPU tensors: a machine without a GPU can then
    compile every kernel for a GPU target (tests/kernels/test_compile_sm90.py)."""
    global _recording
    _recording = []
    try:
        yield _recording
    finally:
        _recording = None


def recording() -> bool:
    """Whether launches are being recorded (record_launches): launchers configure for the GPU."""
    return _recording is not None


def is_interpreting(t: torch.Tensor | torch.device) -> bool:
    """Whether a launch on `t` (a tensor, or its device) runs in the interpreter (launchers use it to
    pick tile sizes)."""
    if _recording is not None:
        return False
    device = t if isinstance(t, torch.device) else t.device
    return device.type == "cpu" or interpret_forced()


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(1, int(n)))


_COUNTERS: dict[tuple[str, str, int | None], torch.Tensor] = {}


def arrival_counters(owner: str, size: int, device: torch.device) -> torch.Tensor:
    """(size,) int32 zeros for a kernel whose programs count their arrivals so that the last one to
    arrive reduces the others' partials: one buffer per (owner, device), allocated once (CUDA graphs
    keep its address), which every launch leaves zeroed."""
    key = (owner, device.type, device.index)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(size, dtype=torch.int32, device=device)
    return _COUNTERS[key]


_SM_COUNT: dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (cached per device index); 4 for any other device."""
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]
