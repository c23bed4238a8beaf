"""Promoting a window slot of the linear-attention state with ort_mtp::CopySlots, in place, on the device.

After a verify forward of width T on a model exported with state_window W >= T, slot j of every
conv/recurrent state holds the state after token T-W+j, and slot W-1 is what the next forward
reads. Committing the first a+1 tokens of the verify is one copy per state tensor: slot a+W-T into
slot W-1. This module runs that copy as a one-node ORT session on the same EP and stream as the
model (all tensors in one launch, stream-ordered, no host round trip), with every output bound to
its own destination buffer so only the slot's bytes move.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

import ops
from ops.copy_slots import Pair, copy_slots_model

from .device import bind, bind_host
from .errors import DriverError

class SlotPromoter:
    """Copies slot `src` to slot `dst` of every live state buffer of a GraphRunner, in place."""

    def __init__(self, runner):
        self.runner = runner
        self.device = runner.device
        pairs = [Pair(np.dtype(s.dtype).name, s.shape, s.shape) for s in runner.spec.recurrent]
        options = ort.SessionOptions()
        options.log_severity_level = 3
        try:
            ops.register(options)
        except ops.LibraryNotFoundError as e:
            raise DriverError(str(e)) from None
        self.session = ort.InferenceSession(copy_slots_model(pairs).SerializeToString(), options,
                                            providers=self.device.providers(False))
        self.slots = np.zeros(2, dtype=np.int64)  # read by the op on the host at run time
        self.run_options = self.device.run_options(None)
        self._bindings: dict[int, ort.IOBinding] = {}
        self.copies = 0

    def promote(self, src_slot: int, dst_slot: int) -> None:
        parity = self.runner.parity
        self.slots[0], self.slots[1] = src_slot, dst_slot
        self.session.run_with_iobinding(self._binding(parity), self.run_options)
        self.copies += 1

    def _binding(self, parity: int) -> ort.IOBinding:
        binding = self._bindings.get(parity)
        if binding is None:
            binding = self.session.io_binding()
            bind_host(binding, "slots", self.slots)
            for i, pair in enumerate(self.runner.states):
                live = pair[parity]
                bind(binding, self.device, f"src_{i}", live, live.shape)
                bind(binding, self.device, f"dst_{i}", live, live.shape)
                bind(binding, self.device, f"out_{i}", live, live.shape, output=True)
            self._bindings[parity] = binding
        return binding
