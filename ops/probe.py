"""Does a custom-op library run one of its ops on an execution provider? Asked by creating a one-node
session (a few ms), so the answer is ONNX Runtime's own: the rewrites put a node on our op only where
it will run (ops.linear_attention, ops.attention).

On CUDA the node must be placed on the CUDA EP itself: a CPU-only kernel would break CUDA graphs and
copy its inputs and outputs every call. With fallback to the CPU EP disabled, a CUDA EP without the
kernel fails the session. ORT refuses that option beside an explicitly listed CPU EP ("Conflicting
session configuration"), so the CUDA EP is the only one listed.
"""

from __future__ import annotations

import functools
import os
import re

from . import visible_gpus

PROVIDERS = ("cpu", "cuda")

# ORT's words for "no kernel of this op for these types on this EP": the op is unknown to every EP, no
# EP implements it, or the CUDA EP left the node to the CPU EP while fallback to it is disabled. Any
# other failure is reported with ORT's own text.
NO_KERNEL = (r"not a registered function/op|Could not find an implementation|"
             r"assigned to the default CPU EP, but fallback to CPU EP has been explicitly disabled")


def unusable(library: str | os.PathLike) -> str | None:
    """None when ONNX Runtime can register `library` as a custom-op library, else why not, in one line."""
    import onnxruntime as ort

    return _register(ort.SessionOptions(), str(library))


def _register(options, library: str) -> str | None:
    options.log_severity_level = 4
    try:
        options.register_custom_ops_library(library)
    except Exception as e:  # ORT's own Fail type: the loader refused the file
        return f"{library} is not a usable custom-op library ({first_line(e)})"
    return None


def refusal(library: str, provider: str, model, op: str, what: str, device_id: int = 0) -> str | None:
    """None when a session of `model` (a one-node ModelProto of ort_mtp::`op`) can be created with
    `library` on `provider`, else why not, in one line. `what` describes the node's types for the
    message ("float16, state_window")."""
    import onnxruntime as ort

    name = os.path.basename(library)
    options = ort.SessionOptions()
    why = _register(options, library)
    if why:
        return why
    if provider == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return f"this ONNX Runtime has no CUDA execution provider to check {op}'s CUDA kernel on"
        if not visible_gpus():
            return f"no GPU here to check that {name} runs ort_mtp::{op} on the CUDA EP"
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        providers = [("CUDAExecutionProvider", {"device_id": str(device_id)})]
    else:
        providers = ["CPUExecutionProvider"]
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=providers)
    except Exception as e:
        text = first_line(e)
        where = "the CUDA EP" if provider == "cuda" else "the CPU EP"
        if re.search(NO_KERNEL, text, re.IGNORECASE):
            return f"{name} has no ort_mtp::{op} kernel for {where} ({what})"
        return f"{name}'s ort_mtp::{op} cannot run on {where} ({what}): {text}"
    return None


def first_line(error: Exception) -> str:
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", str(error).strip())
    return text.splitlines()[0] if text else type(error).__name__


def by_type(op: str, library: str, provider: str, dtype, types: dict, one_node, device_id: int = 0) -> str | None:
    """None when `library` runs ort_mtp::`op` on `provider` for element type `dtype` (an onnx_ir
    DataType), else why not, in one line. `types` maps the DataTypes the op takes to their names;
    `one_node(name)` makes the one-node model to try (called once per library file, provider, type and
    device: the answer is cached, and a rebuilt library is asked again)."""
    if provider not in PROVIDERS:
        return f"ort_mtp::{op} has kernels for the {' and '.join(p.upper() for p in PROVIDERS)} EPs only, not {provider}"
    if dtype not in types:
        return f"ort_mtp::{op} takes {', '.join(types.values())}, not {dtype}"
    try:
        stamp = os.stat(library).st_mtime_ns
    except OSError as e:
        return f"the custom-op library {library} cannot be read ({e.strerror})"
    return _by_type(op, library, stamp, provider, types[dtype], one_node, device_id)


@functools.lru_cache(maxsize=64)
def _by_type(op: str, library: str, stamp: int, provider: str, name: str, one_node, device_id: int) -> str | None:
    return refusal(library, provider, one_node(name), op, name, device_id)
