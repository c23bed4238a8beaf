"""The mlp rewrite (ops.mlp): a gated MLP's gate and up ort_mtp::MatMulNBits, Sigmoid and two Mul ->
one ort_mtp::MatMulNBits with activation="swiglu", on hand-made graphs and the tiny preset: what is
fused, what is kept and why, that the fused graph computes what the five nodes did (within the
activation's float32 rounding), the CUDA EP's answer, and the command line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ops.mlp
from ops import nbits
from ops.__main__ import main as cli_main
from ops.rewrite import MATMUL, MLP, mlp_check, rewrite_model_report

K, N = 64, 40


def _mlp_model(gate_kw=None, up_kw=None, commuted=False, gate_is_output=False, gate_domain="ort_mtp"):
    """x [M, K] -> gate, up (MatMulNBits) -> y = Mul(Mul(gate, Sigmoid(gate)), up) -> y [M, N]."""
    rng = np.random.default_rng(5)
    weights = {}
    inits, nodes = [], []
    for name, kw in (("gate", gate_kw or {}), ("up", up_kw or {})):
        w = nbits.random_weights(rng, K, N, **kw)
        weights[name] = w
        inputs = ["x", f"{name}.B", f"{name}.scales"]
        inits += [nbits.tensor(f"{name}.B", w.b), nbits.tensor(f"{name}.scales", w.scales, w.dtype)]
        if w.zero_points is not None:
            inits.append(nbits.tensor(f"{name}.zp", w.zero_points))
            inputs.append(f"{name}.zp")
        nodes.append(helper.make_node("MatMulNBits", inputs, [name], name=f"/mlp/{name}_proj/MatMul_Q4",
                                      domain=gate_domain if name == "gate" else "ort_mtp",
                                      K=K, N=N, bits=4, block_size=w.block_size, accuracy_level=4))
    nodes.append(helper.make_node("Sigmoid", ["gate"], ["s"], name="/mlp/act_fn/Sigmoid"))
    nodes.append(helper.make_node("Mul", ["s", "gate"] if commuted else ["gate", "s"], ["h"], name="/mlp/act_fn/Mul"))
    nodes.append(helper.make_node("Mul", ["up", "h"] if commuted else ["h", "up"], ["y"], name="/mlp/Mul"))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", N])]
    if gate_is_output:
        outputs.append(helper.make_tensor_value_info("gate", TensorProto.FLOAT, ["M", N]))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", K])],
                              outputs, initializer=inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("ort_mtp", 1), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, ir_version=10, opset_imports=opsets)


def _copy(model):
    return onnx.ModelProto.FromString(model.SerializeToString())


@pytest.mark.parametrize("commuted", [False, True], ids=["as-built", "commuted-muls"])
def test_a_gated_mlp_becomes_one_swiglu_node(commuted, cpu_session):
    model = _mlp_model(commuted=commuted)
    original = _copy(model)
    report = rewrite_model_report(model, rewrites=[MLP], mlp=mlp_check())
    assert report.mlp.rewritten == ["/mlp/act_fn/Sigmoid"] and report.mlp.kept == []
    (node,) = model.graph.node
    assert (node.domain, node.op_type) == ("ort_mtp", "MatMulNBits")
    assert node.name == "/mlp/gate_proj/MatMul_Q4+/mlp/up_proj/MatMul_Q4"
    assert list(node.input) == ["x", "gate.B", "gate.scales", "", "", "", "up.B", "up.scales"]
    assert list(node.output) == ["y"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["N2"] == N and attrs["activation"] == b"swiglu" and attrs["accuracy_level"] == 4
    x = np.random.default_rng(6).standard_normal((5, K)).astype(np.float32) * 4
    fused = cpu_session(model).run(None, {"x": x})[0]
    five = cpu_session(original).run(None, {"x": x})[0]
    # the projections' bits are the same; only the activation's float32 rounding differs (ours vs MLAS')
    assert np.allclose(fused, five, rtol=1e-5, atol=1e-6), np.abs(fused - five).max()


@pytest.mark.parametrize("kwargs,reason", [
    ({"up_kw": {"block_size": 16}}, "the projections differ in block_size"),
    ({"up_kw": {"zero_points": "packed"}}, "only one of the projections has zero points"),
    ({"gate_is_output": True}, "gate (an output of /mlp/gate_proj/MatMul_Q4, inside the block) is a graph output"),
])
def test_mlps_that_do_not_fit_are_kept_with_the_reason(kwargs, reason):
    model = _mlp_model(**kwargs)
    report = rewrite_model_report(model, rewrites=[MLP], mlp=mlp_check())
    assert report.mlp.rewritten == [] and len(report.mlp.kept) == 1
    name, why = report.mlp.kept[0]
    assert name == "/mlp/act_fn/Sigmoid" and reason in why, why
    assert len(model.graph.node) == 5


def test_the_library_is_asked(tmp_path):
    model = _mlp_model()
    report = rewrite_model_report(model, rewrites=[MLP], mlp=lambda dtype: "no kernel here")
    assert report.mlp.kept == [("/mlp/act_fn/Sigmoid", "no kernel here")] and len(model.graph.node) == 5
    # a file that is not a library: the probe's one-line answer
    bogus = tmp_path / "libbogus.so"
    bogus.write_bytes(b"not a library")
    assert "not a usable custom-op library" in ops.mlp.available(str(bogus))


def test_com_microsoft_projections_are_left_to_the_matmul_rewrite(cpu_session):
    """The mlp kind reads ort_mtp nodes only; with the matmul kind (the default order) it fuses."""
    model = _mlp_model(gate_domain="com.microsoft")
    alone = _copy(model)
    assert rewrite_model_report(alone, rewrites=[MLP], mlp=mlp_check()).mlp.total == 0
    report = rewrite_model_report(model, rewrites=[MATMUL, MLP], mlp=mlp_check())
    assert report.count == 1 and len(report.mlp.rewritten) == 1 and len(model.graph.node) == 1


def test_the_include_exclude_patterns_select_by_the_sigmoid(tmp_path):
    from ops.rewrite import NodeFilter

    model = _mlp_model()
    report = rewrite_model_report(model, NodeFilter(exclude="*/act_fn/*"), rewrites=[MLP], mlp=mlp_check())
    assert report.mlp.rewritten == [] and report.mlp.filtered_out == 1 and len(model.graph.node) == 5


def test_tiny_preset_fuses_every_layer_and_keeps_its_logits(tiny_folder, cpu_session):
    model = onnx.load(str(tiny_folder / "model.onnx"), load_external_data=False)
    layers = sum(1 for n in model.graph.node if n.op_type == "Sigmoid" and "/mlp/" in n.name)
    report = rewrite_model_report(model, rewrites=[MATMUL, MLP], mlp=mlp_check(), base_dir=tiny_folder)
    assert layers > 0 and len(report.mlp.rewritten) == layers and report.mlp.kept == []
    assert not any(n.op_type == "Sigmoid" and "/mlp/" in n.name for n in model.graph.node)


def test_cli_only_mlp_needs_our_matmul_nodes(tmp_path, capsys, tiny_folder):
    out = tmp_path / "mlp_only.onnx"
    assert cli_main(["rewrite", str(tiny_folder / "model.onnx"), str(out), "--only", "mlp"]) == 2
    assert "has no gated MLP on ort_mtp MatMulNBits nodes" in capsys.readouterr().err
    out2 = tmp_path / "both"
    assert cli_main(["rewrite", str(tiny_folder), str(out2), "--only", "matmul", "--only", "mlp"]) == 0
    printed = capsys.readouterr().out
    assert "fused" in printed and "gated MLPs" in printed
    fused = onnx.load(str(out2 / "model.onnx"), load_external_data=False)
    assert any(n.op_type == "MatMulNBits" and any(a.name == "activation" for a in n.attribute) for n in fused.graph.node)
    assert Path(tiny_folder / "model.onnx").stat().st_size > 0  # the source folder is untouched
