"""One copy, on the session's device, of the weights the MTP head's graph holds the same as the main graph.

A Qwen3.5 MTP folder's head (mtp.onnx) reads the main model's token embedding and lm_head (onnxruntime-
genai's builder, like `python -m models build`, points mtp.onnx at those tensors in model.onnx.data:
genai_config's shared_initializers), but an ONNX Runtime session loads every initializer of its graph
into memory of its own: an MTP Generator held them twice. On the 27B-class folder that was 2.5 GB of
fp16 embedding and 0.7 GB of int4 lm_head and scales (bench/results/2026-12-05-shared-weights).

ONNX Runtime takes an initializer from SessionOptions.add_initializer instead of the graph's bytes and
uses it in place when it already lives where the session plans it (session_state_utils.cc
SaveInitializedTensors: same device; otherwise it logs a warning and loads the graph's bytes, so a
mismatch costs memory, never a wrong answer). So the first session uploads each tensor the two graphs
share and both sessions are given that one copy.

Only tensors every consumer of which reads them as they are: ONNX Gather (the embedding) and our ops
(ort_mtp::MatMulNBits for lm_head). An ORT kernel that pre-packs a constant input (ORT's own MatMul,
and on some GPUs com.microsoft::MatMulNBits, the `--no-rewrite` path) keeps a packed copy and lets
ORT drop its initializer; our copy would then be held on top.

"The same" is checked, not assumed from the name: a tensor is shared only where both graphs have an
initializer of that name, element type and shape whose bytes, as the session would load them (the
tiles layout's packed bytes where ops.tiles_cache packed it, the folder's otherwise), are equal (the
same bytes of the same file need no reading). Anything unexpected about a tensor (external data
outside the folder, a length that does not match its shape, an element type with no array type here)
leaves it to ORT, which loads it as before.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.capi import _pybind_state as _C  # OrtValue.from_dlpack: a value over memory it does not own

import ops
from ops.paths import inside_folder

log = logging.getLogger(__name__)

MIN_SHARED_BYTES = 1 << 20  # below this a second copy costs less than reading both to compare them
COMPARE_CHUNK = 64 << 20
_ARRAY_TYPES = {
    onnx.TensorProto.UINT8: np.dtype(np.uint8),
    onnx.TensorProto.INT8: np.dtype(np.int8),
    onnx.TensorProto.FLOAT16: np.dtype(np.float16),
    onnx.TensorProto.FLOAT: np.dtype(np.float32),
    onnx.TensorProto.INT32: np.dtype(np.int32),
    onnx.TensorProto.INT64: np.dtype(np.int64),
}


def _signature(t: onnx.TensorProto) -> tuple | None:
    """(element type, shape, bytes) of a tensor this module can share, or None."""
    dtype = _ARRAY_TYPES.get(t.data_type)
    if dtype is None:
        return None
    shape = tuple(int(d) for d in t.dims)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return (t.data_type, shape, nbytes) if nbytes >= MIN_SHARED_BYTES else None


def _reads_in_place(node: onnx.NodeProto) -> bool:
    """A node whose kernel reads its constant inputs where they are (no pre-packed copy of its own)."""
    return node.domain == ops.DOMAIN or (node.domain in ("", "ai.onnx") and node.op_type == "Gather")


def _read_in_place(proto: onnx.ModelProto, name: str) -> bool:
    users = [n for n in proto.graph.node if name in n.input]
    return bool(users) and all(_reads_in_place(n) for n in users)


def shareable_names(first: onnx.ModelProto, second: onnx.ModelProto) -> set[str]:
    """Initializer names both graphs have with the same element type and shape, large enough to be
    worth sharing (their bytes, and who reads them, are checked when the sessions are made)."""
    ours = {t.name: _signature(t) for t in first.graph.initializer}
    return {t.name for t in second.graph.initializer
            if ours.get(t.name) is not None and ours[t.name] == _signature(t)}


def initializer_bytes(t: onnx.TensorProto, folder: Path) -> np.ndarray | None:
    """The tensor's bytes as ORT would read them, without loading them (a read-only map of the
    external data file), shaped and typed; None where they cannot be read as recorded."""
    signature = _signature(t)
    if signature is None:
        return None
    _, shape, nbytes = signature
    dtype = _ARRAY_TYPES[t.data_type]
    if t.data_location != onnx.TensorProto.EXTERNAL:
        raw = t.raw_data
        return np.frombuffer(raw, dtype).reshape(shape) if len(raw) == nbytes else None
    try:  # read_folder refused offsets and lengths that are not numbers; anything else odd: ORT's to report
        info = onnx.external_data_helper.ExternalDataInfo(t)
        if not inside_folder(info.location):
            return None
        path = folder / info.location
        offset = int(info.offset or 0)
        if (info.length and int(info.length) != nbytes) or not path.is_file() or path.stat().st_size < offset + nbytes:
            return None
        return np.memmap(path, dtype, mode="r", offset=offset, shape=shape)
    except (ValueError, OSError):
        return None


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    x, y = a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)
    return all(np.array_equal(x[i:i + COMPARE_CHUNK], y[i:i + COMPARE_CHUNK]) for i in range(0, x.size, COMPARE_CHUNK))


def _file_place(t: onnx.TensorProto, folder: Path) -> tuple | None:
    """(data file, offset, length) of an external tensor, the file by its real path: two graphs that
    name the same place hold the same bytes without reading them."""
    if t.data_location != onnx.TensorProto.EXTERNAL:
        return None
    info = onnx.external_data_helper.ExternalDataInfo(t)
    return os.path.realpath(folder / info.location), int(info.offset or 0), int(info.length or 0)


@dataclass
class _Copy:
    host: np.ndarray  # the bytes the first session would have loaded
    place: tuple | None  # where in the folder they are (None: packed or in the graph)
    array: object  # the device copy
    value: ort.OrtValue  # over `array`, not owning it


class SharedWeights:
    """The device copies of `names`, made by the first session that has them and given to every
    later one whose bytes are the same. Holds them as long as it lives: keep it as long as the sessions."""

    def __init__(self, device, names: set[str]):
        self.device = device
        self.names = set(names)
        self._copies: dict[str, _Copy] = {}
        self.reused: dict[str, int] = {}  # name -> bytes a later session took from the copy instead of loading its own

    def add_to(self, options: ort.SessionOptions, proto: onnx.ModelProto, folder: Path,
               packed: dict[str, np.ndarray] | None = None) -> set[str]:
        """Gives `options` the shared copy of each of `names` in `proto` (uploading it the first time);
        packed: bytes that replace the folder's for some names (the tiles layout). Returns the names
        given, which the session must not be handed any other way."""
        given = set()
        packed = packed or {}
        for t in proto.graph.initializer:
            if t.name not in self.names or not _read_in_place(proto, t.name):
                continue
            host, place = packed.get(t.name), None
            if host is None:
                host = initializer_bytes(t, folder)
                place = _file_place(t, folder) if host is not None else None
            signature = _signature(t)
            if (host is None or signature is None or host.shape != signature[1]
                    or host.dtype != _ARRAY_TYPES[t.data_type]):
                continue
            copy = self._copies.get(t.name)
            if copy is None:
                copy = self._copies[t.name] = _Copy(host, place, *self._upload(host))
            elif (place is not None and place == copy.place) or same_bytes(copy.host, host):
                self.reused[t.name] = host.nbytes
            else:
                log.info("%s: %s differs from the earlier graph's; this session loads its own", folder, t.name)
                continue
            options.add_initializer(t.name, copy.value)
            given.add(t.name)
        return given

    @property
    def reused_bytes(self) -> int:
        """Device (or host) memory the sharing saved: what later sessions did not load again."""
        return sum(self.reused.values())

    def _upload(self, host: np.ndarray) -> tuple[object, ort.OrtValue]:
        """A copy of `host` in the device's memory and an OrtValue over it that does not own it (what
        add_initializer requires: the caller keeps the memory alive)."""
        device = self.device
        with device.active():
            array = device.xp.array(host, copy=True)  # a map of the data file is read once, here
        device.synchronize()  # the sessions run on their own stream: the copy is complete before any run
        value = ort.OrtValue(_C.OrtValue.from_dlpack(array.__dlpack__(), False), array)
        return array, value
