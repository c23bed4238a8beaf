"""ort_mtp custom ops for ONNX Runtime: where the library is, and how to register it.

    import onnxruntime as ort, ops
    so = ort.SessionOptions()
    ops.register(so)                      # same as so.register_custom_ops_library(ops.library_path())
    session = ort.InferenceSession("model.onnx", so, providers=[...])
"""

from __future__ import annotations

import importlib.metadata
import os
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


def register(session_options) -> str:
    """Registers the library with an onnxruntime.SessionOptions; returns the library path."""
    path = library_path()
    session_options.register_custom_ops_library(path)
    return path
