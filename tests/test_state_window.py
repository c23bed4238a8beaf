"""ops.state_window.add_state_window: a state window added in memory to a graph exported without one,
once its linear-attention blocks are ort_mtp::GatedDeltaNet nodes (the driver's MTP sessions use it:
tests/test_driver_mtp.py runs them)."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

import ops.rewrite
from ops.state_window import add_state_window


@pytest.fixture(scope="module")
def graphs(tiny_folder):
    """The tiny folder's main graph as exported, and rewritten onto our ops (no weights loaded)."""
    exported = onnx.load(str(tiny_folder / "model.onnx"), load_external_data=False)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(exported)
    report = ops.rewrite.rewrite_model_report(rewritten, rewrites=("linear-attention",))
    assert report.linear_attention.rewritten and not report.linear_attention.kept
    return exported, rewritten


def _copy(model):
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _dims(value):
    return [d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim]


def _states(model, prefix):
    values = model.graph.input if prefix == "past" else model.graph.output
    return {v.name: v for v in values if v.name.startswith(prefix) and v.name.endswith((".conv", ".recurrent"))}


def test_window_reaches_every_node_and_state(graphs):
    _, rewritten = graphs
    model = _copy(rewritten)
    assert add_state_window(model, 3) is None
    nodes = [n for n in model.graph.node if n.op_type == "GatedDeltaNet"]
    assert nodes and all(helper.get_node_attr_value(n, "state_window") == 3 for n in nodes)
    for prefix in ("past", "present"):
        before, after = _states(rewritten, prefix), _states(model, prefix)
        assert len(after) == 2 * len(nodes)
        for name, value in after.items():
            assert _dims(value) == [3] + _dims(before[name]), name
    # everything else as it was: the other inputs and outputs, the other nodes
    others = [(v.name, _dims(v)) for v in model.graph.input if not v.name.endswith((".conv", ".recurrent"))]
    assert others == [(v.name, _dims(v)) for v in rewritten.graph.input if not v.name.endswith((".conv", ".recurrent"))]
    assert [n.op_type for n in model.graph.node] == [n.op_type for n in rewritten.graph.node]


def test_unwindowable_graphs_are_left_as_they_were(graphs):
    exported, rewritten = graphs
    cases = [(exported, "stays on ONNX Runtime's ops")]
    windowed = _copy(rewritten)
    assert add_state_window(windowed, 2) is None
    cases.append((windowed, "has a state window already"))
    shared = _copy(rewritten)
    past = next(iter(_states(shared, "past")))
    shared.graph.node.append(helper.make_node("Identity", [past], ["also_read"]))
    cases.append((shared, "is not a graph input that it alone reads"))
    no_node = _copy(rewritten)
    kept = [n for n in no_node.graph.node if n.op_type != "GatedDeltaNet"]
    del no_node.graph.node[:]
    no_node.graph.node.extend(kept)
    cases.append((no_node, "no ort_mtp::GatedDeltaNet node"))
    for model, why in cases:
        before = model.SerializeToString()
        reason = add_state_window(model, 4)
        assert reason is not None and why in reason, reason
        assert model.SerializeToString() == before


@pytest.mark.parametrize("window", [0, -1, True, 2.0, None, 65])
def test_window_must_be_an_integer_the_op_takes(graphs, window):
    model = _copy(graphs[1])
    with pytest.raises(ValueError, match="state window"):
        add_state_window(model, window)
