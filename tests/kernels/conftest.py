"""Kernel tests: CPU tensors run through Triton's interpreter (kernels._jit decides per launch from the
tensors' device, so this works whatever was imported first). TRITON_INTERPRET is also set here on
machines without CUDA, so that triton's own library functions are interpreted functions when triton is
first imported below; with CUDA it must stay unset or the compiled GPU kernels could not call them."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
