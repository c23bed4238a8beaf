"""The matmul-pairs rewrite (ops.matmul_pairs): two ort_mtp::MatMulNBits nodes reading one input become
one node with two weight sets, whose outputs are bit for bit the two nodes' (the op's contract:
tests/test_matmul_nbits_pair.py). Here: what is paired and what is not, a whole model's outputs
unchanged to the bit, and the command line."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from ops import nbits
from ops.__main__ import main as cli_main
from ops.rewrite import LINEAR_ATTENTION, MATMUL, MATMUL_PAIRS, MLP, matmul_pairs_check, mlp_check, rewrite_model_report

K = 64


def _readers(specs, share_a=True):
    """One MatMulNBits node per spec (N, block_size, zero_points), all reading x (or each its own input)."""
    rng = np.random.default_rng(9)
    inits, nodes, inputs, outputs = [], [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", K])], []
    for i, (n, block, zp) in enumerate(specs):
        w = nbits.random_weights(rng, K, n, block_size=block, zero_points=zp)
        names = [f"B{i}", f"s{i}"]
        inits += [nbits.tensor(f"B{i}", w.b), nbits.tensor(f"s{i}", w.scales, "float32")]
        if zp:
            inits.append(nbits.tensor(f"zp{i}", w.zero_points))
            names.append(f"zp{i}")
        a = "x" if share_a else f"x{i}"
        if not share_a:
            inputs.append(helper.make_tensor_value_info(a, TensorProto.FLOAT, ["M", K]))
        nodes.append(helper.make_node("MatMulNBits", [a] + names, [f"y{i}"], name=f"proj{i}", domain="ort_mtp",
                                      K=K, N=n, bits=4, block_size=block, accuracy_level=4))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["M", n]))
    graph = helper.make_graph(nodes, "readers", inputs, outputs, initializer=inits)
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                   helper.make_opsetid("ort_mtp", 1)])


def _run(cpu_session, model, feeds):
    return cpu_session(model).run(None, feeds)


def test_pairs_become_two_weight_nodes_with_the_same_bits(cpu_session):
    model = _readers([(40, 32, None), (24, 32, None), (16, 32, None)])
    original = onnx.ModelProto.FromString(model.SerializeToString())
    report = rewrite_model_report(model, rewrites=[MATMUL_PAIRS], matmul_pairs=matmul_pairs_check())
    assert report.matmul_pairs == ["proj0+proj1"]  # the third reader stays alone
    merged = model.graph.node[0]
    assert list(merged.input) == ["x", "B0", "s0", "", "", "", "B1", "s1"] and list(merged.output) == ["y0", "y1"]
    assert {a.name: helper.get_attribute_value(a) for a in merged.attribute}["N2"] == 24
    assert [n.name for n in model.graph.node] == ["proj0+proj1", "proj2"]
    x = np.random.default_rng(10).standard_normal((5, K)).astype(np.float32)
    for got, want in zip(_run(cpu_session, model, {"x": x}), _run(cpu_session, original, {"x": x})):
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_nodes_that_differ_or_read_other_inputs_are_not_paired():
    for specs, share in (([(40, 32, None), (24, 16, None)], True),      # block sizes differ
                         ([(40, 32, None), (24, 32, "packed")], True),  # one has zero points
                         ([(40, 32, None), (24, 32, None)], False)):    # two different inputs
        model = _readers(specs, share_a=share)
        report = rewrite_model_report(model, rewrites=[MATMUL_PAIRS], matmul_pairs=matmul_pairs_check())
        assert report.matmul_pairs == [] and len(model.graph.node) == 2, specs


def test_the_library_is_asked():
    model = _readers([(40, 32, None), (24, 32, None)])
    report = rewrite_model_report(model, rewrites=[MATMUL_PAIRS], matmul_pairs=lambda dtype: "no kernel here")
    assert report.matmul_pairs == [] and len(model.graph.node) == 2


def test_tiny_preset_pairs_each_linear_attention_layers_projections(tiny_folder):
    """After the matmul, linear-attention and mlp rewrites (the MLPs' projections fused with their
    activation), each Gated DeltaNet layer's qkv and z projections are one node; the driver's logits for a prompt and a width-3 forward are the unpaired model's to the bit."""
    import ops.rewrite
    from driver import Generator

    base = onnx.load(str(tiny_folder / "model.onnx"), load_external_data=False)
    layers = sum(n.op_type == "LinearAttention" for n in base.graph.node)
    report = rewrite_model_report(base, rewrites=[MATMUL, LINEAR_ATTENTION, MLP, MATMUL_PAIRS], base_dir=tiny_folder,
                                  mlp=mlp_check(), matmul_pairs=matmul_pairs_check())
    assert layers > 0 and len(report.matmul_pairs) == layers
    assert all("qkv_proj" in name and "z_proj" in name for name in report.matmul_pairs)
    logits = {}
    for name, rewrite in (("paired", True),
                          ("unpaired", tuple(k for k in ops.rewrite.REWRITES if k != MATMUL_PAIRS))):
        gen = Generator(tiny_folder, mode="greedy", rewrite=rewrite, threads=2)
        gen.generate("def read_config(path):", 6)
        gen.main.forward(3)
        logits[name] = np.array(gen.main.logits[:, :3])
    assert np.array_equal(logits["paired"].view(np.uint8), logits["unpaired"].view(np.uint8))


def test_cli_only_matmul_pairs(tiny_folder, tmp_path, capsys):
    """Without the mlp kind each layer's MLP gate and up projections pair up too (no activation)."""
    base = onnx.load(str(tiny_folder / "model.onnx"), load_external_data=False)
    layers = sum(n.op_type == "LinearAttention" for n in base.graph.node)
    mlps = sum(n.op_type == "Sigmoid" and "/mlp/" in n.name for n in base.graph.node)
    assert cli_main(["rewrite", str(tiny_folder), str(tmp_path / "out"), "--only", "matmul",
                     "--only", "matmul-pairs"]) == 0
    assert f"merged {layers + mlps} pairs of MatMulNBits nodes reading one input" in capsys.readouterr().out
    model = onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False)
    assert sum(any(a.name == "N2" for a in n.attribute) for n in model.graph.node) == layers + mlps
    assert sum(n.op_type == "Sigmoid" for n in model.graph.node) >= mlps  # the activations stay as they were
