"""ONNX Runtime sessions for a folder's graphs, with our custom ops, built without touching the folder.

Every com.microsoft MatMulNBits node is swapped for ort_mtp::MatMulNBits (ops.rewrite), whose rows
of a multi-row call are bit-identical to single-row calls: that is what lets a verify forward of
width k+1 produce the same rows as k+1 width-1 decode steps. Every linear-attention block is
replaced by one ort_mtp::GatedDeltaNet node (ops.linear_attention), which computes token by token,
so that its rows and states do not depend on the width either; a block is replaced only where the
library's GatedDeltaNet runs it on the session's device (a CPU kernel alone does not count for CUDA),
and a block that does not fit the pattern is kept on ORT's ops (logged, with the reason). Every
com.microsoft GroupQueryAttention node becomes ort_mtp::GroupQueryAttention (ops.attention), whose
query rows do not depend on the width, where the library runs it on the device (a CUDA build does
unless ORT_MTP_GQA_CUDA=0; otherwise CUDA sessions keep ORT's). Every ONNX MatMul with a constant narrow weight (the Gated DeltaNet's
a and b projections) becomes ort_mtp::MatMul (ops.float_matmul), whose rows do not depend on the
number of rows, where the library runs it on the device. Each gated MLP's gate and up projections and
SiLU become one ort_mtp::MatMulNBits node (activation=swiglu, ops.mlp): four fewer nodes per layer; each
gated attention mixer (q/gate split, per-head norms, MRoPE, attention, sigmoid gate) one
ort_mtp::GatedAttention node (ops.gated_attention); and on CUDA, where the library registers its kernel
(only with ORT_MTP_SKIP_NORM_CUDA=1: measured slower, ops.norm), each com.microsoft
SkipSimplifiedLayerNormalization ours (ops.norm), launched under programmatic dependent launch. The
rewritten graph exists only in memory: the session is created from its bytes, and ORT is pointed at
the model folder for the external weights, so a read-only folder works and no derived file is ever
written; the rewrite itself reads no weight (the graph proto is loaded without external data).

`rewrite`: True (every rewrite), False (ORT's own ops: `--no-rewrite`), or the names of the rewrites
to run (ops.rewrite.REWRITES: "matmul", "linear-attention", "attention", "float-matmul", "mlp",
"gated-attention", "norm").

`pack`: the tiles layout of ort_mtp::MatMulNBits (packing=1): 11% more tokens/s greedy on CUDA
(README, 27B-class). None (the default) packs on CUDA devices and not on the CPU, True / False say
so. The packed weights come from a per-user cache (ops.tiles_cache: built on the first session,
checked and reused after), never from the folder, and are handed to ORT with the session options; a
cache that cannot be used is a warning and a row-major session. Packing needs the "matmul" rewrite:
without it `pack` is ignored.
"""

from __future__ import annotations

import logging
import os
import re

import onnx
import onnxruntime as ort

import ops
import ops.rewrite
import ops.state_window
import ops.tiles_cache

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
    """ORT's log severity for the driver's sessions: DRIVER_ORT_LOG_LEVEL (0 verbose .. 4 fatal, ORT's
    scale), else 4, so that ORT does not print a second line for an error the driver reports. A value
    that is not one of those is an error: ignoring it would leave whoever set it looking for logs."""
    value = os.environ.get(LOG_LEVEL_ENV, "").strip()
    if not value:
        return DEFAULT_LOG_LEVEL
    if value not in ("0", "1", "2", "3", "4"):
        raise DriverError(f"{LOG_LEVEL_ENV} must be one of 0 (verbose), 1 (info), 2 (warning), 3 (error) or 4 "
                          f"(fatal), got {value!r}")
    level = int(value)
    ort.set_default_logger_severity(level)
    return level


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


log = logging.getLogger(__name__)


def rewrites(rewrite) -> tuple[str, ...]:
    """The rewrite kinds a `rewrite` argument asks for: True -> all, False/None -> none, else its names."""
    if rewrite is True:
        return ops.rewrite.REWRITES
    if not rewrite:
        return ()
    kinds = (rewrite,) if isinstance(rewrite, str) else tuple(rewrite)
    unknown = [k for k in kinds if k not in ops.rewrite.REWRITES]
    if unknown:
        raise DriverError(f"unknown rewrite {unknown[0]!r} (one of: {', '.join(ops.rewrite.REWRITES)})")
    return kinds


def rewrite_graph(spec: GraphSpec, rewrite=True, device=None) -> tuple[onnx.ModelProto, ops.rewrite.ModelReport]:
    """A copy of the graph with what `rewrite` asks for on our ops (see the module docstring), for
    `device` (a driver.device object; None: the CPU); returns it and ops.rewrite's report. A
    linear-attention block or attention node that does not fit is logged as a warning; those kept
    because the library lacks the op for the device are logged at INFO."""
    proto = onnx.ModelProto()
    proto.CopyFrom(spec.proto)
    kinds = rewrites(rewrite)
    if not kinds:
        return proto, ops.rewrite.ModelReport()
    provider, device_id = getattr(device, "name", "cpu"), getattr(device, "device_id", 0)
    unavailable: set[str] = set()  # the library's answers (not about a block's shape)

    def recorded(available):
        def check(signature):
            why = available(signature)
            if why:
                unavailable.add(why)
            return why
        return check

    check = recorded(ops.rewrite.gated_delta_net_check(None, provider, device_id))
    attention = recorded(ops.rewrite.attention_check(None, provider, device_id))
    float_matmul = recorded(ops.rewrite.float_matmul_check(None, provider, device_id))
    mlp = ops.rewrite.mlp_check(None, provider, device_id)
    gated = ops.rewrite.gated_attention_check(None, provider, device_id)
    norm = ops.rewrite.norm_check(None, provider, device_id)
    try:
        report = ops.rewrite.rewrite_model_report(proto, None, kinds, check, base_dir=spec.path.parent,
                                                  attention=attention, float_matmul=float_matmul, mlp=mlp,
                                                  gated_attention=gated, norm=norm)
    except ops.rewrite.RewriteError as e:
        raise DriverError(f"{spec.path}: {e}") from None
    for block, why in report.linear_attention.kept:
        level = logging.INFO if why in unavailable else logging.WARNING
        log.log(level, "%s: linear-attention block %s stays on ONNX Runtime's ops: %s", spec.path.name, block, why)
    for node, why in report.attention.kept:
        level = logging.INFO if why in unavailable else logging.WARNING
        log.log(level, "%s: %s stays on ONNX Runtime's GroupQueryAttention: %s", spec.path.name, node, why)
    for node, why in report.float_matmul.kept:
        level = logging.INFO if why in unavailable else logging.WARNING
        log.log(level, "%s: %s stays on ONNX Runtime's MatMul: %s", spec.path.name, node, why)
    # The two fusions and the norm only save time (the nodes they replace are row-consistent already):
    # what they keep is worth a note, not a warning.
    for node, why in report.mlp.kept:
        log.info("%s: the MLP of %s stays as separate nodes: %s", spec.path.name, node, why)
    for node, why in report.gated_attention.kept:
        log.info("%s: the attention mixer of %s stays as separate nodes: %s", spec.path.name, node, why)
    for node, why in report.norm.kept:  # ORT's norm is row-consistent too: only the launch differs
        log.info("%s: %s stays on ONNX Runtime's SkipSimplifiedLayerNormalization: %s", spec.path.name, node, why)
    return proto, report


def create_session(spec: GraphSpec, device, max_len: int, rewrite=True,
                   graph_capture: bool = False, pack: bool | None = None,
                   state_window: int = 0, shared=None) -> tuple[ort.InferenceSession, int]:
    """A session for one graph on `device`, every symbolic dimension but the width fixed (batch 1,
    buffers max_len long). Returns the session and the number of MatMulNBits nodes on our op;
    packed_nodes(session) says how many of them run the tiles layout (see the module docstring).
    state_window W > 0: give the rewritten graph W state slots (ops.state_window) where every
    linear-attention block is on ort_mtp::GatedDeltaNet; session.state_window says whether it did (W)
    or not (0), and the session's states are then those of folder.with_state_window(spec, W).
    shared: a driver.shared_weights.SharedWeights; the session reads its copies of the initializers it
    shares with another graph (the MTP head's embedding and lm_head) instead of loading its own."""
    tiles, want_tiles = None, packing_wanted(pack, device)
    window = 0
    if rewrite:
        proto, report = rewrite_graph(spec, rewrite, device)
        swapped = report.count
        if spec.state_window and getattr(device, "name", "cpu") != "cuda" and report.linear_attention.kept:
            block, why = report.linear_attention.kept[0]
            raise DriverError(f"{spec.path} was exported with state_window={spec.state_window}, which ONNX Runtime's "
                              f"CPU kernels refuse, and its linear-attention block {block} cannot move to "
                              f"ort_mtp::GatedDeltaNet ({why}); use --provider cuda")
        if state_window:
            why = ops.state_window.add_state_window(proto, state_window)
            if why:
                log.info("%s: no state window in memory (%s): a partial accept re-runs its tokens", spec.path.name, why)
            else:
                window = state_window
    else:
        proto, swapped = spec.proto, 0
    options = ort.SessionOptions()
    options.log_severity_level = log_level()
    register_library(options)
    if want_tiles and rewrite and "matmul" in rewrites(rewrite):
        tiles = ops.tiles_cache.prepare(proto, spec.path)
    given = set()
    if shared is not None:
        given = shared.add_to(options, proto, spec.path.parent, tiles.arrays() if tiles is not None else None)
    if tiles is not None:
        tiles.add_to(options, skip=given)
    options.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(spec.path.parent.resolve()))
    for symbol, value in spec.dim_overrides(max_len).items():
        options.add_free_dimension_override_by_name(symbol, value)
    device.session_options(options)
    try:
        session = ort.InferenceSession(proto.SerializeToString(), options,
                                       providers=device.providers(graph_capture))
    except Exception as e:  # ORT raises its own exception types; the message says what it could not do
        raise DriverError(f"{spec.path}: ONNX Runtime could not create a session ({_first_line(e)})") from None
    # ORT may keep reading the packed initializers where they are (the cache's memory map) rather
    # than copy them: they live as long as the session does.
    session.tiles_weights = tiles
    session.state_window = window
    return session, swapped


def packing_wanted(pack: bool | None, device) -> bool:
    """pack=None: the tiles layout on CUDA (where it is faster), not on the CPU (where it is not
    measured faster and the cache would only cost disk)."""
    if pack is None:
        return getattr(device, "name", "cpu") == "cuda"
    if not isinstance(pack, bool):
        raise DriverError(f"pack must be True, False or None, got {pack!r}")
    return pack


def packed_nodes(session) -> int:
    """MatMulNBits nodes a session from create_session runs in the tiles layout."""
    tiles = getattr(session, "tiles_weights", None)
    return tiles.nodes if tiles is not None else 0


def _first_line(error: Exception) -> str:
    """The first line of ORT's message, without its "[ONNXRuntimeError] : 1 : FAIL : " prefix."""
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", str(error).strip())
    return text.splitlines()[0] if text else type(error).__name__
