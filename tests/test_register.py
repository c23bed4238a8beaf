"""Loading the library into a plain onnxruntime.InferenceSession."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ops
from ops import nbits


def _matmul_model():
    w = nbits.random_weights(np.random.default_rng(0), 96, 20, block_size=32, zero_points="packed", bias=True)
    return w, nbits.single_node_model(w, domain=ops.DOMAIN)


def _copy_slots_model():
    inputs = [helper.make_tensor_value_info(n, t, None)
              for n, t in [("slots", TensorProto.INT64), ("src", TensorProto.FLOAT), ("dst", TensorProto.FLOAT)]]
    node = helper.make_node(ops.COPY_SLOTS, ["slots", "src", "dst"], ["out"], domain=ops.DOMAIN)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                  helper.make_opsetid(ops.DOMAIN, 1)])


def test_register_custom_ops_library_in_a_plain_session():
    w, model = _matmul_model()
    options = ort.SessionOptions()
    options.register_custom_ops_library(ops.library_path())
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    a = nbits.round_to(np.random.default_rng(1).standard_normal((3, 96)), "float32")
    y = session.run(None, {"A": a})[0]
    np.testing.assert_allclose(y, nbits.reference(a, w), rtol=1e-5, atol=1e-5)


def test_ops_register_returns_the_library_and_enables_both_ops():
    options = ort.SessionOptions()
    assert ops.register(options) == ops.library_path()
    session = ort.InferenceSession(_copy_slots_model().SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    src, dst = np.arange(6, dtype=np.float32).reshape(3, 2), np.zeros((2, 2), np.float32)
    out = session.run(None, {"slots": np.array([2, 1], np.int64), "src": src, "dst": dst})[0]
    assert np.array_equal(out, [[0, 0], [4, 5]])


def test_many_sessions_share_one_registration():
    """The op domain outlives each session: sessions created, dropped and created again keep working."""
    w, model = _matmul_model()
    a = np.ones((1, 96), np.float32)
    results = []
    for _ in range(3):
        options = ort.SessionOptions()
        ops.register(options)
        results.append(ort.InferenceSession(model.SerializeToString(), options,
                                            providers=["CPUExecutionProvider"]).run(None, {"A": a})[0])
    assert all(np.array_equal(r, results[0]) for r in results)


def test_without_the_library_the_domain_is_unknown():
    _, model = _matmul_model()
    with pytest.raises(Exception, match="ort_mtp"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_library_override_must_name_a_file(monkeypatch, tmp_path):
    monkeypatch.setenv("ORT_MTP_LIBRARY", str(tmp_path / "missing.so"))
    with pytest.raises(ops.LibraryNotFoundError, match="ORT_MTP_LIBRARY="):
        ops.library_path()
