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
import onnx
import onnxruntime as ort
from onnx import helper

import ops

from .device import bind, bind_host
from .errors import DriverError

_ONNX_TYPES = {np.dtype(np.float32): onnx.TensorProto.FLOAT, np.dtype(np.float16): onnx.TensorProto.FLOAT16}


def copy_slots_model(shapes_and_types: list[tuple[tuple[int, ...], np.dtype]]) -> onnx.ModelProto:
    """CopySlots(slots, src_0, dst_0, ...) -> (out_0, ...) over tensors of the given shapes/types.
    Outputs declare their element types: the op's outputs are variadic and heterogeneous."""
    inputs = [helper.make_tensor_value_info("slots", onnx.TensorProto.INT64, [2])]
    outputs, node_inputs = [], ["slots"]
    for i, (shape, dtype) in enumerate(shapes_and_types):
        elem = _ONNX_TYPES[np.dtype(dtype)]
        inputs += [helper.make_tensor_value_info(f"src_{i}", elem, list(shape)),
                   helper.make_tensor_value_info(f"dst_{i}", elem, list(shape))]
        outputs.append(helper.make_tensor_value_info(f"out_{i}", elem, list(shape)))
        node_inputs += [f"src_{i}", f"dst_{i}"]
    node = helper.make_node(ops.COPY_SLOTS, node_inputs, [o.name for o in outputs], domain=ops.DOMAIN)
    graph = helper.make_graph([node], "copy_slots", inputs, outputs)
    return helper.make_model(graph, ir_version=10,
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ops.DOMAIN, 1)])


class SlotPromoter:
    """Copies slot `src` to slot `dst` of every live state buffer of a GraphRunner, in place."""

    def __init__(self, runner):
        self.runner = runner
        self.device = runner.device
        shapes = [(s.shape, s.dtype) for s in runner.spec.recurrent]
        options = ort.SessionOptions()
        options.log_severity_level = 3
        try:
            ops.register(options)
        except ops.LibraryNotFoundError as e:
            raise DriverError(str(e)) from None
        self.session = ort.InferenceSession(copy_slots_model(shapes).SerializeToString(), options,
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
