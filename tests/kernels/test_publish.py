"""kernels.publish (Triton, through the interpreter) against reference.publish_tokens: each launch
writes its tokens into the ring row its counter names and advances the counter; rows wrap."""

from __future__ import annotations

import pytest
import torch

from kernels import reference as ref
from kernels.publish import Mapped, publish_tokens


@pytest.mark.parametrize("size", [1, 3, 8])
def test_matches_the_reference_and_wraps(size):
    ring, want_ring = torch.full((4, 8), -1, dtype=torch.int64), torch.full((4, 8), -1, dtype=torch.int64)
    counter, want_counter = torch.tensor([2]), torch.tensor([2])
    for launch in range(6):
        tokens = torch.arange(size) + 100 * launch
        publish_tokens(tokens, ring, counter)
        ref.publish_tokens(tokens, want_ring, want_counter)
        assert torch.equal(ring, want_ring) and counter.item() == want_counter.item() == 3 + launch
        assert ring[(2 + launch) % 4, :size].tolist() == tokens.tolist()
    assert (ring[:, size:] == -1).all()  # columns past the batch are left alone


def test_rejects_what_it_cannot_write():
    with pytest.raises(ValueError, match="ring"):
        publish_tokens(
            torch.zeros(5, dtype=torch.int64),
            torch.zeros((4, 4), dtype=torch.int64),
            torch.zeros(1, dtype=torch.int64),
        )
    with pytest.raises(ValueError, match="pinned"):
        Mapped(torch.zeros(4, dtype=torch.int64))
