"""ONNX Runtime sessions for a folder's graphs, with our custom ops, built without touching the folder.

Every com.microsoft MatMulNBits node is swapped for ort_mtp::MatMulNBits (ops.rewrite), whose rows
of a multi-row call are bit-identical to single-row calls: that is what lets a verify forward of
width k+1 produce the same rows as k+1 width-1 decode steps. The swapped graph exists only in
memory: the session is created from its bytes, and ORT is pointed at the model folder for the
external weights, so a read-only folder works and no derived file is ever written.
"""

from __future__ import annotations

import os
import re

import onnx
import onnxruntime as ort

import ops
import ops.rewrite

from .errors import DriverError
from .folder import GraphSpec

# Where ORT looks for external initializers of a model given as bytes (it has no path to start from).
EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"
# ORT's log level for the driver's sessions (0 verbose .. 4 fatal). The default, 4, keeps ORT's
# logger from printing its own line for an error it also raises: the driver reports that error as
# its one line (at 3, ORT prints "[E:onnxruntime:...]" above it). Level 1 shows ORT's CUDA-graph
# capture and replay messages, which bench/driver_cuda_check.py counts.
LOG_LEVEL_ENV = "DRIVER_ORT_LOG_LEVEL"
DEFAULT_LOG_LEVEL = 4


def log_level() -> int:
    value = os.environ.get(LOG_LEVEL_ENV, "")
    if value in ("0", "1", "2", "3", "4"):
        level = int(value)
        ort.set_default_logger_severity(level)
        return level
    return DEFAULT_LOG_LEVEL


def register_library(options: ort.SessionOptions) -> None:
    """Registers the custom-op library (ops.library_path: ORT_MTP_LIBRARY or the installed one) with
    `options`; a missing library, or a file ORT cannot load as one, is an error naming the file."""
    try:
        path = ops.library_path()
    except ops.LibraryNotFoundError as e:
        raise DriverError(str(e)) from None
    try:
        options.register_custom_ops_library(path)
    except Exception as e:  # ORT raises its own Fail type, saying why the loader refused the file
        raise DriverError(f"{path} is not a usable ONNX Runtime custom-op library ({_first_line(e)})") from None


def rewrite_graph(spec: GraphSpec) -> tuple[onnx.ModelProto, int]:
    """A copy of the graph with MatMulNBits on our op; returns it and the number of nodes swapped."""
    proto = onnx.ModelProto()
    proto.CopyFrom(spec.proto)
    return proto, ops.rewrite.rewrite_model(proto)


def create_session(spec: GraphSpec, device, max_len: int, rewrite: bool = True,
                   graph_capture: bool = False) -> tuple[ort.InferenceSession, int]:
    """A session for one graph on `device`, every symbolic dimension but the width fixed (batch 1,
    buffers max_len long). Returns the session and the number of MatMulNBits nodes on our op."""
    proto, swapped = rewrite_graph(spec) if rewrite else (spec.proto, 0)
    options = ort.SessionOptions()
    options.log_severity_level = log_level()
    register_library(options)
    options.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(spec.path.parent.resolve()))
    for symbol, value in spec.dim_overrides(max_len).items():
        options.add_free_dimension_override_by_name(symbol, value)
    device.session_options(options)
    try:
        session = ort.InferenceSession(proto.SerializeToString(), options,
                                       providers=device.providers(graph_capture))
    except Exception as e:  # ORT raises its own exception types; the message says what it could not do
        raise DriverError(f"{spec.path}: ONNX Runtime could not create a session ({_first_line(e)})") from None
    return session, swapped


def _first_line(error: Exception) -> str:
    """The first line of ORT's message, without its "[ONNXRuntimeError] : 1 : FAIL : " prefix."""
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", str(error).strip())
    return text.splitlines()[0] if text else type(error).__name__
