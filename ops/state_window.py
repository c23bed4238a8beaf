"""A state window for a graph exported without one, added in memory once its linear-attention blocks
are ort_mtp::GatedDeltaNet nodes.

With `state_window` W a GatedDeltaNet node reads slot W-1 of its past conv and recurrent states and
writes W slots: slot j holds the state after token S-W+j of its S tokens (README.md, the op reference).
After an MTP verify of k+1 <= W tokens the state after every accepted prefix is then in a slot, and a
partial accept copies one slot into slot W-1 (driver/copy_slots.py) instead of running the accepted
tokens through the model again. A folder built with `python -m models build --state-window W` has the
window in its graph; onnxruntime-genai's builder writes none, and ONNX Runtime's own CPU kernels refuse
one. `add_state_window` gives any graph the window once ops.rewrite has moved every block onto
GatedDeltaNet: each node gets the attribute, and each state it reads or writes (graph inputs
past.N.conv / past.N.recurrent, outputs present.N.*) a leading axis of W. Nothing else in the graph
reads those states, so nothing else changes.

    import ops.state_window
    why = ops.state_window.add_state_window(model, 2)   # None, or why the graph was left as it was
"""

from __future__ import annotations

import onnx
from onnx import helper

from . import DOMAIN

GATED_DELTA_NET = "GatedDeltaNet"
# GatedDeltaNet's state inputs (past_conv, past_recurrent) and outputs (present_conv, present_recurrent).
STATE_INPUTS = (9, 10)
STATE_OUTPUTS = (1, 2)
# The most slots ort_mtp::GatedDeltaNet takes (csrc/gated_delta_net/gated_delta_net.cc, kMaxStateWindow):
# an MTP round needs k+1 <= 9, so this bounds a mistake, not a use.
MAX_STATE_WINDOW = 64


def window_out_of_range(window: int) -> str | None:
    """Why a folder's state window W (0: none) cannot be built or converted, or None."""
    if not 0 <= window <= MAX_STATE_WINDOW:
        return (f"state_window must be from 0 to {MAX_STATE_WINDOW} (the most slots ort_mtp::GatedDeltaNet takes), "
                f"got {window}")
    return None
# The com.microsoft ops of a linear-attention block that ops.linear_attention did not move: their CPU
# kernels take no window (a block left on them keeps the graph unwindowed).
ORT_BLOCK_OPS = ("LinearAttention", "CausalConvWithState")


def add_state_window(model: onnx.ModelProto, window: int) -> str | None:
    """Adds state_window=`window` (>= 1) to every GatedDeltaNet node of `model`'s graph and a leading axis
    of `window` to the states they read and write, in place. Returns None, or (leaving the model as it
    was) why not: no such node, a block left on ONNX Runtime's ops, a node windowed already, or a state
    that is not a graph input or output read or written by that node alone."""
    if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= MAX_STATE_WINDOW:
        raise ValueError(f"state window must be an integer from 1 to {MAX_STATE_WINDOW}, got {window!r}")
    graph = model.graph
    left = [n for n in graph.node if n.op_type in ORT_BLOCK_OPS and n.domain != DOMAIN]
    if left:
        return f"linear-attention node {left[0].name or left[0].op_type} stays on ONNX Runtime's ops"
    nodes = [n for n in graph.node if n.domain == DOMAIN and n.op_type == GATED_DELTA_NET]
    if not nodes:
        return "the graph has no ort_mtp::GatedDeltaNet node"
    inputs = {v.name: v for v in graph.input}
    outputs = {v.name: v for v in graph.output}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    states_in, states_out = [], []
    for node in nodes:
        label = node.name or GATED_DELTA_NET
        if any(a.name == "state_window" and a.i != 0 for a in node.attribute):
            return f"{label} has a state window already"
        if len(node.input) <= max(STATE_INPUTS) or len(node.output) <= max(STATE_OUTPUTS):
            return f"{label} does not have the op's state inputs and outputs"
        for i in STATE_INPUTS:
            name = node.input[i]
            if name not in inputs or readers.get(name) != 1:
                return f"{label}'s state input '{name}' is not a graph input that it alone reads"
            states_in.append(inputs[name])
        for i in STATE_OUTPUTS:
            name = node.output[i]
            if name not in outputs:
                return f"{label}'s state output '{name}' is not a graph output"
            states_out.append(outputs[name])

    for node in nodes:
        kept = [a for a in node.attribute if a.name != "state_window"]
        del node.attribute[:]
        node.attribute.extend(kept + [helper.make_attribute("state_window", window)])
    for value in states_in + states_out:
        if not value.type.tensor_type.HasField("shape"):  # an output of unknown shape stays so
            continue
        shape = value.type.tensor_type.shape
        dims = list(shape.dim)
        shape.ClearField("dim")
        shape.dim.add().dim_value = window
        shape.dim.extend(dims)
    windowed = {v.name for v in states_in + states_out}
    kept_info = [v for v in graph.value_info if v.name not in windowed]  # shapes inferred without the window
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    return None
