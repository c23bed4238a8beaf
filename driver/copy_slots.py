"""Promoting a window slot of the linear-attention state, in place, on the device.

After a verify forward of width T on a model exported with state_window W >= T, slot j of every
conv/recurrent state holds the state after token T-W+j, and slot W-1 is what the next forward
reads. Committing the first a+1 tokens of the verify is one copy per state tensor: slot a+W-T into
slot W-1. This module runs those copies as one call of the CopySlots op's own copy
(ops.copy_slots.RangeCopier: all tensors in one launch on the model's stream, stream-ordered, no host
round trip) with the byte ranges computed once per (state parity, source slot, destination slot)
from the runner's fixed buffers. A one-node ORT session of the op would do the same copy, plus ORT's
per-run host work while the GPU waits (the round has just synchronised to read the accepted count).
"""

from __future__ import annotations

import numpy as np

import ops
from ops.copy_slots import RangeCopier, ranges

from .errors import DriverError


class SlotPromoter:
    """Copies slot `src` to slot `dst` of every live state buffer of a GraphRunner, in place."""

    def __init__(self, runner):
        self.runner = runner
        self.device = runner.device
        try:
            self._copy = RangeCopier()
        except ops.LibraryNotFoundError as e:
            raise DriverError(str(e)) from None
        self._cuda = self.device.name == "cuda"
        self._stream = self.device.stream.ptr if self._cuda else 0  # the model's stream (CuPy's, shared with ORT)
        self._ranges: dict[tuple[int, int, int], np.ndarray] = {}
        self.copies = 0

    def promote(self, src_slot: int, dst_slot: int) -> None:
        key = (self.runner.parity, src_slot, dst_slot)
        records = self._ranges.get(key)
        if records is None:
            records = self._ranges[key] = self._slot_ranges(*key)
        try:
            self._copy(records, cuda=self._cuda, stream=self._stream)
        except RuntimeError as e:  # the library's message (a CUDA error, say)
            raise DriverError(f"promoting state slot {src_slot} to slot {dst_slot} failed: {e}") from None
        self.copies += 1

    def _slot_ranges(self, parity: int, src_slot: int, dst_slot: int) -> np.ndarray:
        """One range per live state buffer: slot src_slot -> slot dst_slot of the same buffer (slots
        are the leading axis of a C-contiguous buffer that never moves)."""
        triples = []
        for pair in self.runner.states:
            live = pair[parity]
            slots = live.shape[0]
            if not (0 <= src_slot < slots and 0 <= dst_slot < slots):
                raise DriverError(f"slots ({src_slot}, {dst_slot}) out of range for a state of {slots} slots")
            slot_bytes = live.nbytes // slots
            base = self.device.pointer(live)
            if src_slot != dst_slot:
                triples.append((base + src_slot * slot_bytes, base + dst_slot * slot_bytes, slot_bytes))
        return ranges(triples)
