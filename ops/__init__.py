"""ort_mtp custom ops for ONNX Runtime: where the library is, and how to register it.

    import onnxruntime as ort, ops
    so = ort.SessionOptions()
    ops.register(so)                      # same as so.register_custom_ops_library(ops.library_path())
    session = ort.InferenceSession("model.onnx", so, providers=[...])

ops.cuda_kernels_built() says whether the library has its CUDA kernels, ops.visible_gpus() which GPUs
the NVIDIA driver lists (`python -m ops info` reports both).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import shutil
import struct
import subprocess
from pathlib import Path

DOMAIN = "ort_mtp"
"""The custom-op domain of every op in the library."""

MATMUL_NBITS = "MatMulNBits"
"""Drop-in for com.microsoft::MatMulNBits (same attributes, inputs and output)."""

COPY_SLOTS = "CopySlots"
"""Stream-ordered copy of state slots between tensors, many tensors per launch."""

_LIBRARY_NAME = "libort_mtp_ops.so"
_ENV = "ORT_MTP_LIBRARY"
_DISTRIBUTION = "ort-mtp"


class LibraryNotFoundError(RuntimeError):
    """The compiled custom-op library is missing (package not built/installed)."""


def library_path() -> str:
    """Absolute path of the compiled custom-op library.

    ORT_MTP_LIBRARY overrides the search (e.g. a library built by hand with CMake); otherwise the
    library installed inside this package by `pip install .` is used.
    """
    override = os.environ.get(_ENV)
    if override:
        if not Path(override).is_file():
            raise LibraryNotFoundError(f"{_ENV}={override} does not name a file")
        return str(Path(override).resolve())
    for candidate in _candidates():
        if candidate.is_file():
            return str(candidate.resolve())
    raise LibraryNotFoundError(
        f"{_LIBRARY_NAME} not found in {list(__path__)}: install the package with `pip install .` "
        f"(it builds the library), or set {_ENV} to a library built with CMake"
    )


def _candidates():
    # Next to this file (a regular install), in the package's other folders (editable installs),
    # and where the installed distribution put it: running from a source checkout imports the
    # sources, which hold no library, while the installed copy does.
    for folder in __path__:
        yield Path(folder) / _LIBRARY_NAME
    try:
        dist = importlib.metadata.distribution(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return
    for file in dist.files or ():
        if file.name == _LIBRARY_NAME:
            yield Path(dist.locate_file(file))


def library_function(name: str, restype, argtypes):
    """A C function the library exports for direct calls (OrtMtpPackTiles, OrtMtpCopyRanges), through
    ctypes, from the library library_path() names (each file is loaded once per process; ONNX Runtime
    loading the same file for a session shares it)."""
    fn = getattr(_loaded(library_path()), name)
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


@functools.lru_cache(maxsize=None)
def _loaded(path: str):
    import ctypes

    return ctypes.CDLL(path)


def register(session_options) -> str:
    """Registers the library with an onnxruntime.SessionOptions; returns the library path."""
    path = library_path()
    session_options.register_custom_ops_library(path)
    return path


def cuda_kernels_built(path: str | os.PathLike | None = None) -> bool:
    """Whether the library (default: library_path()) holds the CUDA kernels, read from the file
    without loading it: nvcc puts the device code it compiles into the ELF section .nv_fatbin, which a
    CPU-only build (no nvcc found, or ORT_MTP_CUDA=OFF) does not have. ValueError for a file that is
    not a 64-bit ELF library."""
    return ".nv_fatbin" in _elf_section_names(Path(path or library_path()))


def _elf_section_names(path: Path) -> set[str]:
    """Section names of a 64-bit little-endian ELF file (Linux on x86-64 or aarch64)."""
    with open(path, "rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF" or header[4:6] != b"\x02\x01":
            raise ValueError(f"{path} is not a 64-bit little-endian ELF library")
        (table_offset,) = struct.unpack_from("<Q", header, 0x28)  # e_shoff
        entry_size, count, names_index = struct.unpack_from("<HHH", header, 0x3A)  # e_shentsize, e_shnum, e_shstrndx
        f.seek(table_offset)
        table = f.read(entry_size * count)
        # each section header starts (sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size)
        headers = [struct.unpack_from("<IIQQQQ", table, i * entry_size) for i in range(count)]
        names_offset, names_size = headers[names_index][4:6]
        f.seek(names_offset)
        names = f.read(names_size)
    return {names[h[0]:names.index(b"\0", h[0])].decode() for h in headers}


def _cuda_driver_device_count() -> int:
    """Devices the CUDA driver library (libcuda.so.1) counts; 0 without the library or on any error."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
    except OSError:
        return 0
    return count.value


def visible_gpus() -> list[str]:
    """The NVIDIA GPUs of this machine, found without creating a CUDA context: one `nvidia-smi -L`
    line each ("GPU 0: NAME (UUID: ...)"); where nvidia-smi is not installed, one line per GPU the
    NVIDIA kernel driver lists in /proc/driver/nvidia/gpus, or else (a container without either) one
    per device the CUDA driver library counts (cuInit + cuDeviceGetCount, no context). [] means no GPU:
    no driver, or no device. CUDA_VISIBLE_DEVICES applies only to that last count."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        driver_gpus = Path("/proc/driver/nvidia/gpus")
        if driver_gpus.is_dir():
            return [f"GPU at PCI {p.name}" for p in sorted(driver_gpus.iterdir())]
        return [f"GPU {i} (counted by libcuda)" for i in range(_cuda_driver_device_count())]
    try:
        listed = subprocess.run([tool, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in listed.splitlines() if line.startswith("GPU ")]
