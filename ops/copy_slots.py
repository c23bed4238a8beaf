"""The one-node ort_mtp::CopySlots model: what the driver runs to promote state slots, and what the
tests and device checks build their cases from.

    CopySlots(slots, src_0, dst_0, src_1, dst_1, ...) -> (out_0, out_1, ...)

slots is int64 [2] = (src_slot, dst_slot) in host memory; (-1, -1) copies whole tensors. out_i is
dst_i with slot dst_slot replaced by src_i's slot src_slot (README.md, "Op reference").

RangeCopier runs the op's copy directly (the library's C entry OrtMtpCopyRanges), for a caller that
holds the buffers' addresses: the same kernel without an ORT run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

Dims = Sequence[int | str] | None  # None: shape not declared (only the op's run-time checks see it)


@dataclass
class Pair:
    """One (src, dst) -> out triple. Types are numpy dtype names or "bfloat16"; dst and out default
    to src's type and out's shape to dst's (the op's contract)."""

    dtype: str
    src_shape: Dims
    dst_shape: Dims
    dst_dtype: str | None = None
    out_dtype: str | None = None
    out_shape: Dims | str = "dst"


def elem_type(dtype) -> int:
    """ONNX element type of a numpy dtype (or the name "bfloat16", which numpy lacks)."""
    if str(dtype) == "bfloat16":
        return TensorProto.BFLOAT16
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def copy_slots_model(pairs: Sequence[Pair | tuple], *, node_name: str = "copy_slots", slots_shape: Dims = (2,),
                     n_inputs: int | None = None, n_outputs: int | None = None) -> onnx.ModelProto:
    """A model of one CopySlots node over `pairs` (Pair, or (dtype, src_shape, dst_shape) tuples).
    Inputs slots, src_i, dst_i; outputs out_i, each declaring its element type (the op's outputs are
    variadic and heterogeneous, so ORT takes their types from the graph). n_inputs / n_outputs keep
    only the first tensor inputs / outputs, to build malformed nodes. ir_version 10: ORT 1.31 refuses
    newer IR versions."""
    pairs = [p if isinstance(p, Pair) else Pair(*p) for p in pairs]
    inputs = [helper.make_tensor_value_info("slots", TensorProto.INT64, slots_shape)]
    outputs, names = [], ["slots"]
    for i, p in enumerate(pairs):
        src, dst = elem_type(p.dtype), elem_type(p.dst_dtype or p.dtype)
        inputs += [helper.make_tensor_value_info(f"src_{i}", src, _dims(p.src_shape)),
                   helper.make_tensor_value_info(f"dst_{i}", dst, _dims(p.dst_shape))]
        names += [f"src_{i}", f"dst_{i}"]
        out_shape = p.dst_shape if p.out_shape == "dst" else p.out_shape
        outputs.append(helper.make_tensor_value_info(f"out_{i}", elem_type(p.out_dtype or p.dst_dtype or p.dtype),
                                                     _dims(out_shape)))
    if n_inputs is not None:
        names = names[:n_inputs]
    if n_outputs is not None:
        outputs = outputs[:n_outputs]
    node = helper.make_node("CopySlots", names, [o.name for o in outputs], name=node_name, domain="ort_mtp")
    graph = helper.make_graph([node], "copy_slots", inputs[: len(names)], outputs)
    return helper.make_model(graph, ir_version=10,
                             opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ort_mtp", 1)])


def expected(src: np.ndarray, dst: np.ndarray, slots) -> np.ndarray:
    """What out is for (src, dst) and slots = (src_slot, dst_slot): the op's reference."""
    s, d = (int(v) for v in slots)
    if (s, d) == (-1, -1):
        return src.copy()
    out = dst.copy()
    out[d] = src[s]
    return out


RANGE = np.dtype([("src", "<u8"), ("dst", "<u8"), ("bytes", "<u8")])
"""One byte range for RangeCopier: source and destination addresses and the length (OrtMtpCopyRange)."""


def ranges(triples) -> np.ndarray:
    """An array of RANGE records from (src address, dst address, bytes) triples."""
    return np.array([tuple(int(v) for v in t) for t in triples], dtype=RANGE)


class RangeCopier:
    """The CopySlots op's copy called directly: the library's OrtMtpCopyRanges, looked up once (the
    library ops.library_path names when the copier is made), so a call costs one ctypes call."""

    def __init__(self):
        import ctypes

        from . import library_function

        self._fn = library_function("OrtMtpCopyRanges", ctypes.c_char_p,
                                    [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p])

    def __call__(self, records: np.ndarray, *, cuda: bool, stream: int = 0) -> None:
        """Copies every range of `records` (a C-contiguous RANGE array; ranges must not overlap): on the
        CPU by memmove (host addresses), or on CUDA as one launch per 128 ranges on `stream` (device
        addresses; a cudaStream_t as an int, 0 the legacy default stream), queued without a host
        synchronisation. RuntimeError with the library's message if it fails."""
        if records.dtype != RANGE or not records.flags.c_contiguous:
            raise ValueError("records must be a C-contiguous array of ops.copy_slots.RANGE")
        error = self._fn(records.ctypes.data, len(records), 1 if cuda else 0, stream or None)
        if error is not None:
            raise RuntimeError(error.decode(errors="replace"))


def _dims(shape: Dims):
    return None if shape is None else list(shape)
