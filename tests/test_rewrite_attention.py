"""The attention rewrite (ops.attention): com.microsoft GroupQueryAttention -> ort_mtp GroupQueryAttention
on the tiny preset and hand-made nodes, what is kept and why, the CUDA EP (no kernel of ours yet), and
the command line."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx_ir
import pytest
from onnx import helper

import ops
import ops.attention
import ops.group_query_attention as gqa
import ops.rewrite
from ops.__main__ import main as cli_main
from ops.rewrite import ATTENTION, attention_check, rewrite_model_report


def _load(folder: Path) -> onnx.ModelProto:
    return onnx.load(str(folder / "model.onnx"), load_external_data=False)


def _attention_nodes(model):
    return [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]


def test_tiny_preset_attention_nodes_move_to_our_op(tiny_folder):
    model = _load(tiny_folder)
    before = {n.name: n for n in map(lambda n: onnx.NodeProto.FromString(n.SerializeToString()), _attention_nodes(model))}
    report = rewrite_model_report(model, rewrites=[ATTENTION], attention=attention_check())
    assert sorted(report.attention.rewritten) == sorted(before) and len(before) == 2
    assert report.count == 0 and report.linear_attention.total == 0  # only the kind asked for
    for node in _attention_nodes(model):
        old = before[node.name]
        assert node.domain == "ort_mtp"
        assert list(node.input) == list(old.input)[:7] and list(node.output) == list(old.output)
        assert {a.name: helper.get_attribute_value(a) for a in node.attribute} == \
            {a.name: helper.get_attribute_value(a) for a in old.attribute}
    assert any(o.domain == "ort_mtp" for o in model.opset_import)


def _node_model(**attrs) -> onnx.ModelProto:
    """ORT's node with the builder's twelve inputs (the optional ones empty) unless `inputs` says."""
    inputs = attrs.pop("inputs", list(gqa.INPUTS) + [""] * 5)
    outputs = attrs.pop("outputs", list(gqa.OUTPUTS))
    model = gqa.model(gqa.GqaConfig(), domain="com.microsoft", node_name="attn")
    node = model.graph.node[0]
    del node.input[:]
    node.input.extend(inputs)
    del node.output[:]
    node.output.extend(outputs)
    for name, value in attrs.items():
        node.attribute.append(helper.make_attribute(name, value))
    extra = [n for n in inputs if n and n not in gqa.INPUTS]
    model.graph.input.extend(helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in extra)
    model.graph.output.extend(helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None)
                              for n in outputs if n not in gqa.OUTPUTS)
    return model


@pytest.mark.parametrize("kwargs,reason", [
    ({"do_rotary": 1}, "do_rotary=1 is not supported"),
    ({"k_quant_type": "PER_TENSOR"}, "attribute 'k_quant_type' is not supported"),
    ({"inputs": list(gqa.INPUTS) + ["cos", "sin"]}, "input cos_cache is given"),
    ({"inputs": list(gqa.INPUTS) + [""] * 4 + ["sink"]}, "input head_sink is given"),
    ({"inputs": ["query", "", ""] + list(gqa.INPUTS[3:])}, "key (packed QKV) is not given"),
    ({"outputs": list(gqa.OUTPUTS) + ["qk"]}, "qk (an output of attn, inside the block) is a graph output"),
])
def test_nodes_our_op_cannot_run_are_kept_with_the_reason(kwargs, reason):
    model = _node_model(**kwargs)
    report = rewrite_model_report(model, rewrites=[ATTENTION], attention=attention_check())
    assert report.attention.rewritten == [] and len(report.attention.kept) == 1
    name, why = report.attention.kept[0]
    assert name == "attn" and reason in why, why
    assert model.graph.node[0].domain == "com.microsoft"


def test_the_rewritten_node_runs_as_the_original_did(cpu_session):
    """The builder's twelve-input node, rewritten, computes what ORT's computes (within rounding) and
    leaves the same KV cache."""
    import numpy as np

    model = _node_model()
    import copy
    ours = copy.deepcopy(model)
    assert len(rewrite_model_report(ours, rewrites=[ATTENTION], attention=attention_check()).attention.rewritten) == 1
    feeds = gqa.random_case(np.random.default_rng(2), gqa.GqaConfig(), batch=1, seq=3, past=4, buffer=9)
    want = cpu_session(model).run(None, feeds)
    got = cpu_session(ours).run(None, feeds)
    np.testing.assert_allclose(got[0], want[0], atol=1e-6)
    assert got[1].tobytes() == want[1].tobytes() and got[2].tobytes() == want[2].tobytes()


def test_cuda_models_keep_onnx_runtime_attention():
    """The library has CPU kernels only: asked for the CUDA EP the answer is no, and every node stays."""
    why = ops.attention.available(ops.library_path(), "cuda", onnx_ir.DataType.FLOAT16)
    assert why is not None and "CUDA" in why, why
    model = _node_model()
    report = rewrite_model_report(model, rewrites=[ATTENTION], attention=attention_check(None, "cuda"))
    assert report.attention.rewritten == [] and report.attention.kept[0][1] == \
        ops.attention.available(ops.library_path(), "cuda", onnx_ir.DataType.FLOAT)
    assert ops.attention.available(ops.library_path(), "cpu", onnx_ir.DataType.FLOAT16) is None
    assert ops.attention.available(ops.library_path(), "cpu", onnx_ir.DataType.BFLOAT16) is None
    assert "CPU and CUDA EPs only, not rocm" in ops.attention.available(ops.library_path(), "rocm")


def test_cli_only_attention(tiny_folder, tmp_path, capsys):
    assert cli_main(["rewrite", str(tiny_folder / "model.onnx"), str(tmp_path / "a.onnx"), "--only", "attention"]) == 0
    assert "rewrote 2 of 2 GroupQueryAttention nodes into ort_mtp GroupQueryAttention" in capsys.readouterr().out
    model = onnx.load(str(tmp_path / "a.onnx"), load_external_data=False)
    assert {n.domain for n in _attention_nodes(model)} == {"ort_mtp"}
    assert {n.domain for n in model.graph.node if n.op_type == "MatMulNBits"} == {"com.microsoft"}
    onnx.save(_node_model(do_rotary=1), str(tmp_path / "rot.onnx"))
    assert cli_main(["rewrite", str(tmp_path / "rot.onnx"), str(tmp_path / "b.onnx"), "--only", "attention"]) == 2
    err = capsys.readouterr().err
    assert "none of its 1 GroupQueryAttention nodes can be rewritten" in err and "do_rotary=1" in err
    relu = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                               [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                                               [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])]))
    onnx.save(relu, str(tmp_path / "relu.onnx"))
    assert cli_main(["rewrite", str(tmp_path / "relu.onnx"), str(tmp_path / "c.onnx"), "--only", "attention"]) == 2
    assert "has no com.microsoft GroupQueryAttention node" in capsys.readouterr().err
