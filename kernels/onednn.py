"""float32 projections on the CPU through oneDNN, each weight reordered once into oneDNN's blocked layout.

F.linear hands a float32 product to oneMKL's SGEMM, which packs the weight operand again on every call:
at a decode step's 1-16 rows that packing costs as much as the product itself. oneDNN's inner product
takes a weight reordered ahead of time (`torch.ops.mkldnn._reorder_linear_weight`, the layout
torch.compile's CPU freezing uses), so each call only streams it (docs/performance.md, C1, has the
timings). At one row the small projections (under ONE_ROW_MIN_NUMEL weights) pay oneDNN's fixed cost
per call and stay on F.linear, as does every product where torch has no oneDNN.

The sums run in another order than SGEMM's, so results differ from F.linear's in the last bits (~1e-5
relative). A packed copy made on first use sits beside its weight, doubling that weight's memory; past
MAX_PACKED_BYTES held at once (a copy counts until its weight is freed), further weights stay on
F.linear. pack_model() instead replaces a loaded model's projection weights by their packed form, so
the dense copies are freed (docs/performance.md, memory); such a weight goes to `product` at any row
count, and a reader of dense weights (F.linear) raises instead of computing with it."""

from __future__ import annotations

import functools
import weakref

import torch

MAX_PACKED_BYTES = 4 << 30  # packed copies kept in all
ONE_ROW_MIN_NUMEL = 1 << 18  # a one-row product takes the packed weight from this many weights

_packed_bytes = 0


@functools.cache
def _available() -> bool:
    try:
        ops = torch.ops.mkldnn
        ops_there = bool(ops._linear_pointwise and ops._reorder_linear_weight)
        return torch.backends.mkldnn.is_available() and ops_there
    except (AttributeError, RuntimeError):  # a torch built without oneDNN
        return False


def packed_weight(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """weight packed for oneDNN where this product goes there (float32 on the CPU, 2-D, no autograd, a
    shape it speeds up, within MAX_PACKED_BYTES), else None: what `product` takes."""
    if not (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32):
        return None
    if weight.is_mkldnn:  # pack_model's: the packed form is all there is (any rows, empty, N-D)
        return weight
    if x.dim() != 2 or weight.dim() != 2 or x.shape[0] == 0 or x.shape[1] != weight.shape[1]:
        return None
    if bias is not None and (bias.dtype != torch.float32 or bias.shape != weight.shape[:1]):
        return None
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return None
    if x.shape[0] == 1 and weight.numel() < ONE_ROW_MIN_NUMEL:
        return None
    return _packed(weight) if _available() else None


def takes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether `linear` takes this product (packed_weight gives the weight it would use)."""
    return packed_weight(x, weight, bias) is not None


def _version(weight: torch.Tensor) -> int:
    try:
        return weight._version
    except RuntimeError:  # an inference tensor keeps no version counter (and is not edited after loading)
        return -1


def _packed(weight: torch.Tensor) -> torch.Tensor | None:
    """weight (N, K) reordered for oneDNN, made once and kept on the weight (again if it is edited in
    place); None past MAX_PACKED_BYTES."""
    global _packed_bytes
    held = getattr(weight, "_onednn_packed", None)
    version = _version(weight)
    if held is not None and held[0] == version:
        return held[1]
    size = weight.numel() * weight.element_size()
    if held is None and _packed_bytes + size > MAX_PACKED_BYTES:
        return None
    with torch.no_grad():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())
    if held is None:  # counted until the weight (and the copy it holds) is freed
        _packed_bytes += size
        weakref.finalize(weight, _release, size)
    weight._onednn_packed = (version, packed)
    return packed


@torch.no_grad()
def pack_model(model: torch.nn.Module) -> int:
    """Replace each float32 CPU nn.Linear weight of a loaded model by its oneDNN-packed form, so the
    dense weight is freed instead of sitting beside a packed copy; returns the bytes packed. Call
    after loading and before the first forward (which may keep references to the parameters).
    Embeddings, which are read by row (and a tied lm_head, which is the embedding), stay dense."""
    if not _available():
        return 0
    packed = 0
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        weight = module.weight
        if weight.device.type != "cpu" or weight.dtype != torch.float32 or weight.is_mkldnn:
            continue
        if module.bias is not None and module.bias.dtype != torch.float32:
            continue
        module.weight = torch.nn.Parameter(
            torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous()), requires_grad=False
        )
        packed += weight.numel() * weight.element_size()
        del weight
    return packed


def _release(size: int) -> None:
    global _packed_bytes
    _packed_bytes -= size


def product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) @ weight (N, K)^T + bias, from packed = packed_weight(x, weight, bias)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) @ weight (N, K)^T + bias, where `takes` said so."""
    return product(x, _packed(weight), bias)
