"""The decode graphs' step inputs, copied to the device on a stream of their own.

A captured decode step reads its ids, positions, slots, lengths and block-table rows from static
buffers. Copied there on the compute stream, the copies run after the previous step's sampling and
before the next forward: the GPU waits ~35 us a step for them (H200, W2's `--timeline`: "tokens ->
prepared"). Here the host writes step k into row k % SLOTS of a pinned ring, a side stream copies that
row into the same row of a device ring while step k - 1 still computes, and the graph's first launch
(kernels.step_inputs, the layout of the mapped step graphs) moves the row named by a device counter into
the static buffers and advances the counter. The compute stream only waits for the copy's event,
normally long done.

Ordering: the host writes a pinned row once the copy that last read it has run (its event); the copy
into a device row waits for the replay that last read that row (an event the compute stream records
after each replay); replays consume rows in the order the host fills them, so the device counter and
the host's count stay equal.
"""

from __future__ import annotations

import numpy as np
import torch

SLOTS = 2


class InputRing:
    def __init__(self, n: int, max_blocks: int, device: torch.device) -> None:
        self.n, self.max_blocks, self.device = n, max_blocks, device
        cuda = device.type == "cuda"
        width64, width32 = 4 * n + 4, n + n * max_blocks
        self.host64 = torch.zeros((SLOTS, width64), dtype=torch.int64, pin_memory=cuda)
        self.host32 = torch.zeros((SLOTS, width32), dtype=torch.int32, pin_memory=cuda)
        self.dev64 = torch.zeros((SLOTS, width64), dtype=torch.int64, device=device)
        self.dev32 = torch.zeros((SLOTS, width32), dtype=torch.int32, device=device)
        for ring in (self.host64, self.dev64):  # what the captures read: slots and sources -1 (no writes)
            ring[:, 2 * n : 4 * n] = -1
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)  # rows consumed, on the device
        self.arrivals = torch.zeros(1, dtype=torch.int32, device=device)
        self.stream = torch.cuda.Stream(device) if cuda else None
        self.copied = [torch.cuda.Event() for _ in range(SLOTS)] if cuda else None
        self.read = [torch.cuda.Event() for _ in range(SLOTS)] if cuda else None
        self.filled = 0  # rows the host has filled
        self.replayed = 0  # rows the replays have consumed

    def restart(self) -> None:
        """After the captures (whose own runs advanced the device counter): host and device at 0."""
        self.counter.zero_()
        self.filled = self.replayed = 0

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        """The pinned row pair for the next step ((4n + 4,) int64, (n + n * max_blocks,) int32) as numpy
        views, once the copy that last read them has run."""
        at = self.filled % SLOTS
        if self.copied is not None:
            self.copied[at].synchronize()
        return self.host64[at].numpy(), self.host32[at].numpy()

    def upload(self, rows: int) -> None:
        """The filled row to the device (its first `rows` block-table rows), on the side stream."""
        at = self.filled % SLOTS
        m = self.n + rows * self.max_blocks
        if self.stream is None:
            self.dev64[at].copy_(self.host64[at])
            self.dev32[at, :m].copy_(self.host32[at, :m])
        else:
            with torch.cuda.stream(self.stream):
                self.stream.wait_event(self.read[at])  # the replay that last read this row has run
                self.dev64[at].copy_(self.host64[at], non_blocking=True)
                self.dev32[at, :m].copy_(self.host32[at, :m], non_blocking=True)
                self.copied[at].record(self.stream)
        self.filled += 1

    def before_replay(self) -> None:
        """The compute stream waits for the copy of the row this replay reads."""
        if self.replayed >= self.filled:
            raise RuntimeError("a decode graph replay without its prepared inputs")
        if self.copied is not None:
            torch.cuda.current_stream(self.device).wait_event(self.copied[self.replayed % SLOTS])

    def after_replay(self) -> None:
        if self.read is not None:
            self.read[self.replayed % SLOTS].record()
        self.replayed += 1
