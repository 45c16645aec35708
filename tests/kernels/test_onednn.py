"""kernels.onednn: the CPU's float32 projections through oneDNN with packed weights, against F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import dispatch, onednn

pytestmark = pytest.mark.skipif(not onednn._available(), reason="a torch without oneDNN")


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _close(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("m", [1, 3, 16, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_f_linear(m, with_bias):
    w = _rand(1536, 256, seed=0)  # large enough for one row too
    b = _rand(1536, seed=1) if with_bias else None
    x = _rand(m, 300, seed=2)[:, 20:276]  # rows with a stride: not contiguous
    with torch.inference_mode():
        assert onednn.takes(x, w, b)
        _close(onednn.linear(x, w, b), F.linear(x, w, b))
        _close(dispatch.linear(x, w, b), F.linear(x, w, b))


def test_what_it_takes(monkeypatch):
    w, x = _rand(512, 256, seed=0), _rand(4, 256, seed=1)
    assert onednn.takes(x, w, None)
    assert not onednn.takes(x[:1], w, None)  # one row of a small weight: F.linear's is faster
    assert onednn.takes(x[:1], _rand(2048, 256, seed=2), None)
    assert not onednn.takes(x.half(), w.half(), None)
    assert not onednn.takes(x[:0], w, None)
    assert not onednn.takes(x[:, :128], w, None)  # K mismatch: F.linear names the error
    trained = w.clone().requires_grad_()
    assert not onednn.takes(x, trained, None)  # autograd stays with F.linear
    with torch.no_grad():
        assert onednn.takes(x, trained, None)
    monkeypatch.setattr(onednn, "_available", lambda: False)  # no oneDNN: F.linear
    assert not onednn.takes(x, w, None)
    assert torch.equal(dispatch.linear(x, w), F.linear(x, w))


def test_packs_once_and_again_after_an_edit():
    w, x = _rand(512, 256, seed=0), _rand(8, 256, seed=1)
    first = onednn._packed(w)
    assert onednn._packed(w) is first  # kept on the weight
    _close(onednn.linear(x, w), F.linear(x, w))
    w.mul_(-2.0)  # edited in place: packed again
    assert onednn._packed(w) is not first
    _close(onednn.linear(x, w), F.linear(x, w))


def test_memory_cap(monkeypatch):
    monkeypatch.setattr(onednn, "_packed_bytes", 0)
    monkeypatch.setattr(onednn, "MAX_PACKED_BYTES", 600 * 256 * 4)
    x = _rand(4, 256, seed=1)
    a, b = _rand(512, 256, seed=2), _rand(512, 256, seed=3)
    assert onednn.takes(x, a, None)
    assert not onednn.takes(x, b, None)  # past the cap: F.linear
    assert torch.equal(dispatch.linear(x, b), F.linear(x, b))
    _close(dispatch.linear(x, a), F.linear(x, a))


def test_lm_head():
    w, h = _rand(8192, 256, seed=0), _rand(5, 256, seed=1)
    with torch.inference_mode():
        _close(dispatch.lm_head(h, w), F.linear(h, w))
        assert torch.equal(dispatch.lm_head(h.half(), w.half()), F.linear(h.half(), w.half()))


def test_a_freed_weight_gives_its_room_back(monkeypatch):
    import gc

    monkeypatch.setattr(onednn, "_packed_bytes", 0)
    monkeypatch.setattr(onednn, "MAX_PACKED_BYTES", 600 * 256 * 4)
    x = _rand(4, 256, seed=1)
    a = _rand(512, 256, seed=2)
    assert onednn.takes(x, a, None) and onednn._packed_bytes == 512 * 256 * 4
    del a
    gc.collect()
    assert onednn._packed_bytes == 0
    b = _rand(512, 256, seed=3)
    assert onednn.packed_weight(x, b, None) is onednn._packed(b)  # packed once, the room reused
    _close(dispatch.linear(x, b), F.linear(x, b))


def test_pack_model_keeps_only_the_packed_weights():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(100, 256),
        torch.nn.Linear(256, 512, bias=True),
        torch.nn.Linear(512, 64, bias=False),  # small: one row went to F.linear before packing
    )
    dense = {name: p.detach().clone() for name, p in model.named_parameters()}
    x = _rand(3, 256, seed=1)
    with torch.inference_mode():
        want = [F.linear(x, dense["1.weight"], dense["1.bias"]), F.linear(x[:1], dense["1.weight"])]
    packed = onednn.pack_model(model)
    assert packed == (256 * 512 + 512 * 64) * 4
    assert model[1].weight.is_mkldnn and model[2].weight.is_mkldnn
    assert not model[0].weight.is_mkldnn  # read by row: stays dense
    assert torch.equal(model[1].bias, dense["1.bias"])
    assert torch.equal(model[1].weight.to_dense(), dense["1.weight"])  # the same weights, another layout
    assert onednn.pack_model(model) == 0  # once
    with torch.inference_mode():
        _close(dispatch.linear(x, model[1].weight, model[1].bias), want[0])
        _close(dispatch.linear(x[:1], model[1].weight), want[1])
        y = _rand(1, 512, seed=2)
        _close(dispatch.linear(y, model[2].weight), F.linear(y, dense["2.weight"]))  # one row, small
        with pytest.raises(RuntimeError):  # a dense reader fails loudly, it never reads stale data
            F.linear(x, model[1].weight)
