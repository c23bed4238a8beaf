"""What every group's checks run on: the device under test and the CPU EP beside it (the driver's own
devices, driver/device.py), typed buffers on them, and the Context a group is given.

Buffers are CuPy arrays on the CUDA EP and numpy arrays on the CPU EP, as the driver's are, bound to
IOBindings by pointer; on CUDA every buffer operation runs on the stream ONNX Runtime was given
(device.active()), so it is ordered with the runs without a host synchronisation. Values come as
float32 arrays holding numbers the element type represents exactly (ops.nbits.round_to), so an
upload is lossless. bfloat16, which numpy and CuPy lack, is held as its uint16 bit patterns and bound
with ONNX's BFLOAT16 element type.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from onnx import TensorProto

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # ops and driver from the checkout

from driver.device import CpuDevice, bind  # noqa: E402
from ops.nbits import UNIT_ROUNDOFF  # noqa: E402,F401  (the checks' tolerances are multiples of it)

STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}  # how floats are held
BF16_NAN = np.uint16(0x7FC0)
INT_VIEW = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def to_storage(values: np.ndarray, dtype: str) -> np.ndarray:
    """Host array of element type `dtype` (a float name, or any numpy dtype name) holding `values`;
    bfloat16: float32 values that bfloat16 represents exactly, as bit patterns."""
    if dtype == "bfloat16":
        return (np.ascontiguousarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.ascontiguousarray(values, dtype=STORAGE.get(dtype, dtype))


def to_float64(stored: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (stored.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return stored.astype(np.float64)


@dataclass
class Buffer:
    """One array on `device` with its ONNX element type name (`data`: CuPy or numpy)."""

    device: Any
    data: Any
    dtype: str

    @classmethod
    def upload(cls, device, values: np.ndarray, dtype: str) -> "Buffer":
        """`values` (floats exactly representable in `dtype`, or any array of a numpy dtype) on the device."""
        host = to_storage(values, dtype)
        with device.active():
            return cls(device, device.xp.array(host), dtype)

    @classmethod
    def poisoned(cls, device, shape, dtype: str) -> "Buffer":
        """A float buffer filled with NaN: an element a kernel leaves unwritten stays NaN."""
        with device.active():
            data = device.xp.empty(tuple(shape), dtype=STORAGE[dtype])
            data.fill(BF16_NAN if dtype == "bfloat16" else np.nan)
        return cls(device, data, dtype)

    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)

    def host(self) -> np.ndarray:
        """A host copy, after the stream's work up to now (bfloat16 as bit patterns)."""
        with self.device.active():
            host = self.device.to_host(self.data)
        self.device.synchronize()  # CuPy before 13 copies asynchronously when given a stream
        return np.array(host, copy=True)

    def floats(self) -> np.ndarray:
        """The values as float64 on the host."""
        return to_float64(self.host(), self.dtype)

    def bits(self) -> np.ndarray:
        """The raw bit patterns as integers (for bit-identity checks)."""
        host = self.host()
        return host.view(INT_VIEW[host.dtype.itemsize])

    def raw(self) -> np.ndarray:
        """The bytes, leading (slot) axis kept: [shape[0], bytes per slot]."""
        host = np.ascontiguousarray(self.host())
        return host.view(np.uint8).reshape(host.shape[0] if host.ndim else 1, -1)

    def write(self, values: np.ndarray) -> None:
        """New contents in place (the buffer a binding or a captured graph points at)."""
        host = to_storage(values, self.dtype)
        with self.device.active():
            self.data[...] = self.device.xp.asarray(host)

    def copy_from(self, other: "Buffer") -> None:
        """Device-side copy of another buffer (same shape and type) into this one."""
        with self.device.active():
            self.data[...] = other.data

    def fill_nan(self) -> None:
        with self.device.active():
            self.data.fill(BF16_NAN if self.dtype == "bfloat16" else np.nan)

    def bind(self, binding, name: str, output: bool = False) -> None:
        elem = TensorProto.BFLOAT16 if self.dtype == "bfloat16" else None
        bind(binding, self.device, name, self.data, self.data.shape, output=output, elem_type=elem)


@dataclass
class Context:
    """What a group's checks are given. `device` is the device under test (CUDA, or the CPU EP for a
    dry run); `cpu` the CPU EP, where our CPU op is the exact reference the CUDA results are also
    compared with. env: the kernel-selection switches this process was started with."""

    device: Any
    rng: np.random.Generator
    random_cases: int = 24
    env: dict = field(default_factory=dict)
    cpu: Any = field(default_factory=CpuDevice)
    started: Callable[[str], None] = lambda label: None  # marks the case now running: a crash names it

    @property
    def variant(self) -> str:
        return self.env.get("ORT_MTP_GEMV_VARIANT", "mma")

    @property
    def pdl(self) -> bool:
        return self.env.get("ORT_MTP_GEMV_PDL", "1") == "1"

    @property
    def on_gpu(self) -> bool:
        return self.device.name == "cuda"


ENV_KEYS = ("ORT_MTP_GEMV_VARIANT", "ORT_MTP_GEMV_PDL", "ORT_MTP_GDN_COLS", "ORT_MTP_GQA_CUDA",
            "ORT_MTP_GATED_ATTENTION_CUDA", "ORT_MTP_SKIP_NORM_CUDA")  # read once per process by the library


def kernel_env() -> dict:
    return {k: os.environ[k] for k in ENV_KEYS if os.environ.get(k)}
