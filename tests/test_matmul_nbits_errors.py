"""Bad input to ort_mtp::MatMulNBits: every case gives an ONNX Runtime error that names the node and
what is wrong, at session creation when the weights are initializers and at run time when they are
graph inputs; never a crash or a silently wrong result (a crash would take the test process down)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ops import nbits

NODE = "layers.3/mlp/down_proj"
LABEL = f"MatMulNBits node '{NODE}'"


def _weights(zero_points="packed", bias=True, dtype="float32", bits=4):
    rng = np.random.default_rng(11)
    return nbits.random_weights(rng, 64, 8, bits=bits, block_size=32, dtype=dtype, zero_points=zero_points, bias=bias)


def _model(w=None, **kwargs) -> onnx.ModelProto:
    return nbits.single_node_model(w or _weights(), domain="ort_mtp", node_name=NODE, **kwargs)


def _set_attr(model, name, value):
    node = model.graph.node[0]
    for attr in [a for a in node.attribute if a.name == name]:
        node.attribute.remove(attr)
    if value is not None:
        node.attribute.append(helper.make_attribute(name, value))
    return model


def _replace(model, name, array):
    inits = model.graph.initializer
    index = next(i for i, t in enumerate(inits) if t.name == name)
    inits[index].CopyFrom(numpy_helper.from_array(array, name))
    return model


def _as_graph_input(model, name, array):
    """Turns initializer `name` into a graph input of `array`'s type and unknown rank, so that only
    the op's run-time checks see its shape."""
    inits = model.graph.initializer
    index = next(i for i, t in enumerate(inits) if t.name == name)
    del inits[index]
    elem = helper.np_dtype_to_tensor_dtype(array.dtype)
    model.graph.input.append(helper.make_tensor_value_info(name, elem, None))
    return model


def _creation_error(cpu_session, model) -> str:
    with pytest.raises(Exception) as info:
        cpu_session(model)
    return str(info.value)


def _run_error(cpu_session, model, feeds) -> str:
    session = cpu_session(model)
    with pytest.raises(Exception) as info:
        session.run(None, feeds)
    return str(info.value)


A = np.ones((2, 64), np.float32)
W = _weights()


@pytest.mark.parametrize(
    "attr,value,expected",
    [
        ("K", None, "missing required int attribute 'K'"),
        ("N", None, "missing required int attribute 'N'"),
        ("block_size", None, "missing required int attribute 'block_size'"),
        ("K", 64.0, "attribute 'K' must be an int"),
        ("bits", 8.0, "attribute 'bits' must be an int"),
        ("block_size", "32", "attribute 'block_size' must be an int"),
        ("accuracy_level", [1, 2], "attribute 'accuracy_level' must be an int"),
        ("bits", 2, "bits=2 is not supported (4 or 8)"),
        ("bits", 3, "bits=3 is not supported (4 or 8)"),
        ("block_size", 8, "block_size must be a power of two in [16, 256], got 8"),
        ("block_size", 48, "block_size must be a power of two in [16, 256], got 48"),
        ("block_size", 512, "block_size must be a power of two in [16, 256], got 512"),
        ("accuracy_level", 5, "accuracy_level must be in [0, 4], got 5"),
        ("K", 0, "attribute K must be in [1, 2147483647], got 0"),
        ("N", -8, "attribute N must be in [1, 2147483647], got -8"),
        # Beyond int32 the sizes derived from K and N could wrap around and pass the shape checks.
        ("N", 2**31, "attribute N must be in [1, 2147483647], got 2147483648"),
        ("N", 8 + 2**60, "attribute N must be in [1, 2147483647], got 1152921504606846984"),
        ("K", 2**40, "attribute K must be in [1, 2147483647], got 1099511627776"),
    ],
)
def test_bad_attributes(attr, value, expected, cpu_session):
    message = _creation_error(cpu_session, _set_attr(_model(), attr, value))
    assert LABEL in message and expected in message


@pytest.mark.parametrize(
    "attr,value,expected",
    [
        ("K", 100, "input B has shape [8, 2, 16], expected [8, 4, 16] for K=100, N=8"),
        ("N", 9, "input B has shape [8, 2, 16], expected [9, 2, 16] for K=64, N=9"),
        ("block_size", 16, "input B has shape [8, 2, 16], expected [8, 4, 8] for K=64, N=8, block_size=16"),
        ("bits", 8, "input B has shape [8, 2, 16], expected [8, 2, 32]"),
    ],
)
def test_attributes_that_disagree_with_b(attr, value, expected, cpu_session):
    model = _model()
    if attr == "K":  # keep A consistent with the new K so that only B disagrees
        model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = value
    message = _creation_error(cpu_session, _set_attr(model, attr, value))
    assert LABEL in message and expected in message


BAD_WEIGHTS = [
    ("B", np.zeros((8, 2, 8), np.uint8), "input B has shape [8, 2, 8], expected [8, 2, 16]"),
    ("B", np.zeros((0, 2, 16), np.uint8), "input B has shape [0, 2, 16], expected [8, 2, 16]"),
    ("B", np.zeros((8, 32), np.int32)[:, :0].astype(np.uint8), "input B has shape [8, 0], expected [8, 2, 16]"),
    ("scales", np.ones((8, 3), np.float32), "input scales has shape [8, 3], expected [8, 2] or [16]"),
    ("scales", np.ones((0,), np.float32), "input scales has shape [0], expected [8, 2] or [16]"),
    ("zero_points", np.zeros((8, 2), np.uint8),
     "input zero_points (uint8, packed) has shape [8, 2], expected [8, 1] or [8]"),
    ("zero_points", np.zeros((8, 1), np.int32), "input zero_points must be uint8 or A's type float32, got int32"),
    ("bias", np.zeros((9,), np.float32), "input bias has shape [9], expected [8]"),
    ("bias", np.zeros((1, 8), np.float32), "input bias has shape [1, 8], expected [8]"),
]


@pytest.mark.parametrize("name,array,expected", BAD_WEIGHTS, ids=lambda v: v if isinstance(v, str) and len(v) < 12 else "")
def test_bad_weight_initializers_fail_at_session_creation(name, array, expected, cpu_session):
    message = _creation_error(cpu_session, _replace(_model(), name, array))
    assert LABEL in message and expected in message


@pytest.mark.parametrize("name,array,expected", BAD_WEIGHTS, ids=lambda v: v if isinstance(v, str) and len(v) < 12 else "")
def test_bad_weight_inputs_fail_at_run(name, array, expected, cpu_session):
    model = _as_graph_input(_model(), name, array)
    message = _run_error(cpu_session, model, {"A": A, name: array})
    assert LABEL in message and expected in message


def test_typed_zero_points_shape(cpu_session):
    w = _weights(zero_points="typed")
    message = _creation_error(cpu_session, _replace(_model(w), "zero_points", np.zeros((8, 1), np.float32)))
    assert LABEL in message and "input zero_points (float32) has shape [8, 1], expected [8, 2] or [16]" in message


def test_g_idx_is_rejected(cpu_session):
    model = _model()
    node = model.graph.node[0]
    node.input[4] = "g_idx"  # inputs: A, B, scales, zero_points, "" (g_idx), bias
    model.graph.initializer.append(numpy_helper.from_array(np.arange(64, dtype=np.int32) // 32, "g_idx"))
    message = _creation_error(cpu_session, model)
    assert LABEL in message and "g_idx" in message and "not supported" in message


def test_a_with_wrong_last_dimension_fails_at_run(cpu_session):
    model = _model(a_shape=("M", "K_dynamic"))
    message = _run_error(cpu_session, model, {"A": np.ones((2, 65), np.float32)})
    assert LABEL in message and "input A has shape [2, 65]; its last dimension must equal K=64" in message


def test_unsupported_activation_type_names_the_node(cpu_session):
    """float64 A has no kernel: ORT's type check rejects the graph and names our node and input."""
    model = _model()
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    message = _creation_error(cpu_session, model)
    assert NODE in message and "(A)" in message and "tensor(double)" in message


def test_scales_of_another_type_than_a(cpu_session):
    """float16 scales with float32 A match no registered kernel."""
    model = _replace(_model(), "scales", W.scales.astype(np.float16))
    message = _creation_error(cpu_session, model)
    assert NODE in message and "MatMulNBits" in message


def test_b_of_wrong_type_names_the_node(cpu_session):
    model = _replace(_model(), "B", W.b.astype(np.int8))
    message = _creation_error(cpu_session, model)
    assert NODE in message and "(B)" in message and "tensor(int8)" in message


def test_session_still_usable_after_errors(cpu_session):
    """After all the failures above, the library still runs a good model correctly in this process."""
    a = nbits.round_to(np.random.default_rng(3).standard_normal((3, 64)), "float32")
    y = cpu_session(_model()).run(None, {"A": a})[0]
    assert np.allclose(y, nbits.reference(a, W), rtol=1e-5, atol=1e-5)
