"""Grammar masks kept in a device table and applied by the fused sampler (runner/device_masks.py),
run on the CPU: the fused sampler through the Triton interpreter, the table as a CPU tensor."""

from __future__ import annotations

import pytest
import torch

from kernels import dispatch, dispatch_pointwise
from runner.device_masks import DeviceMasks
from runner.sampler import Sampler
from runner.sampling_params import SamplingParams
from runner.sequence import Sequence

VOCAB = 40  # two mask words: rows cross a word boundary


class _Keyed:
    """Allows one token; rows of one token share a key (as requests in one grammar state do)."""

    fills: list[int] = []

    def __init__(self, token: int, keyed: bool = True) -> None:
        self.token = token
        self.keyed = keyed
        self.failed = False  # the row turns out to be this request's own once computed

    def mask_key(self, remaining_tokens: int):
        return None if not self.keyed or self.failed else ("one", self.token)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int, remaining_tokens: int) -> None:
        _Keyed.fills.append(self.token)
        bitmask[row].zero_()
        bit = self.token % 32
        bitmask[row, self.token // 32] = 1 << bit if bit < 31 else -(1 << 31)  # int32
        if self.token == 13:
            self.failed = True

    def accept_token(self, token_id: int) -> bool:
        return True

    def is_terminated(self) -> bool:
        return False


@pytest.fixture
def fused_on_cpu(monkeypatch):
    # the sampler takes its CUDA path (fused kernel, deferred masks) with CPU tensors
    for module in (dispatch, dispatch_pointwise):  # the sampler's ops and the bitmask's
        monkeypatch.setattr(module, "use_triton", lambda t: True)


def _sampler(capacity: int = 12) -> Sampler:
    s = Sampler(VOCAB, {VOCAB - 1}, torch.device("cpu"), seed=0)
    s.device_masks = DeviceMasks((VOCAB + 31) // 32, scratch=6, capacity=capacity, device=torch.device("cpu"))
    return s


def _seqs(tokens: list[int | None], temperature: float = 0.0) -> list[Sequence]:
    seqs = []
    for t in tokens:
        seq = Sequence("r", [0, 1], SamplingParams(temperature=temperature, max_tokens=10))
        if t is not None:
            seq.constraint = _Keyed(t, keyed=t != 5)
        seqs.append(seq)
    return seqs


def _step(s: Sampler, seqs: list[Sequence]) -> list[int]:
    logits = torch.zeros(len(seqs), VOCAB)
    logits[:, VOCAB - 2] = 5.0  # the unmasked argmax
    before = logits.clone()
    out = s.process(logits, seqs)
    assert torch.equal(out, before)  # masks are left to the fused sampler, not written into the logits
    return s.sample(out, seqs).tolist()


def test_rows_are_computed_once_then_read_from_the_table(fused_on_cpu):
    s, dm = _sampler(), None
    dm = s.device_masks
    seqs = _seqs([33, 1, 33, 1, None, 5])
    _Keyed.fills = []
    assert _step(s, seqs) == [33, 1, 33, 1, VOCAB - 2, 5]
    assert sorted(_Keyed.fills) == [1, 5, 33]  # one fill per key, the unkeyed row its own
    assert (dm.hits, dm.misses) == (0, 4)  # the second row of a key shares the first's staging row
    _Keyed.fills = []
    assert _step(s, seqs) == [33, 1, 33, 1, VOCAB - 2, 5]
    assert _Keyed.fills == [5]  # cached rows are not computed again
    assert dm.hits == 4
    # greedy and sampled rows alike obey their masks
    hot = _seqs([33, 1, 33, 1, None, 5], temperature=1.0)
    for seq, cold in zip(hot, seqs, strict=True):
        seq.constraint = cold.constraint
    tokens = _step(s, hot)
    assert tokens[:4] + tokens[5:] == [33, 1, 33, 1, 5]


def test_a_row_that_loses_its_key_once_computed_is_not_cached(fused_on_cpu):
    s = _sampler()
    seqs = _seqs([13, 13])
    _Keyed.fills = []
    assert _step(s, seqs) == [13, 13]
    assert _step(s, seqs) == [13, 13]
    # the first computed it (and lost its key); the second then had no key and computed its own
    assert _Keyed.fills == [13, 13, 13]
    assert len(s.device_masks._slots) == 0


def test_eviction_keeps_rows_right(fused_on_cpu):
    s = _sampler(capacity=12)
    for start in range(0, 36, 6):  # 36 keys through a 12-row cache
        tokens = list(range(start, start + 6))
        assert _step(s, _seqs(tokens)) == tokens
    assert len(s.device_masks._slots) == 12
    again = list(range(30, 36))  # the most recent keys are still cached
    _Keyed.fills = []
    assert _step(s, _seqs(again)) == again and _Keyed.fills == []
    assert _step(s, _seqs([0, 1])) == [0, 1] and _Keyed.fills == [0, 1]  # the oldest were evicted


def test_table_must_hold_two_batches():
    with pytest.raises(ValueError, match="two batches"):
        DeviceMasks(2, scratch=8, capacity=15, device=torch.device("cpu"))


def test_cpu_engines_apply_masks_in_place():
    s = Sampler(VOCAB, {VOCAB - 1}, torch.device("cpu"), seed=0, max_rows=8, mask_cache_rows=64)
    assert s.device_masks is None  # the table is a CUDA feature
    seqs = _seqs([3])
    logits = torch.zeros(1, VOCAB)
    out = s.process(logits, seqs)
    assert torch.isinf(out[0]).sum() == VOCAB - 1 and s.sample(out, seqs).tolist() == [3]
