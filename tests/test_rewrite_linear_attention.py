"""The linear-attention rewrite (ops.linear_attention, run by ops.rewrite and the driver): every Gated
DeltaNet block of our tiny preset and of onnxruntime-genai's builder folders (CPU fp32; CUDA fp16 with
state_window=4) becomes one ort_mtp::GatedDeltaNet node with the right attributes, inputs and
outputs; a block that does not fit is kept, reported with the reason, and the graph still checks and
runs.

Most of it needs no GatedDeltaNet kernel: the structure is read from the rewritten protos, and the
wiring is run through a stand-in, a model-local function ort_mtp::GatedDeltaNet whose body is the
com.microsoft subgraph rebuilt from the node's attributes alone (`_stand_in`), so the rewritten
model computes bit for bit what the original computes exactly when the attributes and the inputs
are right. The end-to-end test on the real op runs when the library registers it.
"""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnx_ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ops
import ops.linear_attention
import ops.probe
import ops.rewrite
from ops.__main__ import main as cli_main
from ops.rewrite import LINEAR_ATTENTION, MATMUL, rewrite_folder, rewrite_model_report

MS = "com.microsoft"
BLOCK_OPS = {"CausalConvWithState", "LinearAttentionGate", "LinearAttention", "GatedRMSNorm"}
ATTRIBUTES = ("num_k_heads", "num_v_heads", "k_head_dim", "v_head_dim", "state_window", "scale", "epsilon")
F32 = lambda x: float(np.float32(x))  # noqa: E731  (a float attribute as ONNX stores it)


def _load(folder: Path) -> onnx.ModelProto:
    return onnx.load(str(folder / "model.onnx"), load_external_data=False)


def _layers(model) -> list[int]:
    return sorted(int(n.name.split("/")[2].split(".")[1]) for n in model.graph.node
                  if n.op_type == "LinearAttention" and n.domain == MS)


def _node(model, name):
    return next(n for n in model.graph.node if n.name == name)


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _expected_blocks(model) -> dict[str, dict]:
    """From the original graph, node by node: what each block's GatedDeltaNet must read and write."""
    blocks = {}
    for layer in _layers(model):
        base = f"/model/layers.{layer}/linear_attn"
        conv, gate = _node(model, f"{base}/CausalConvWithState"), _node(model, f"{base}/LinearAttentionGate")
        la, norm = _node(model, f"{base}/LinearAttention"), _node(model, f"{base}/GatedRMSNorm")
        transpose = _node(model, f"{base}/qkv_proj/Transpose")
        blocks[f"{base}/GatedDeltaNet"] = {
            "inputs": [transpose.input[0], norm.input[2], gate.input[0], gate.input[3], conv.input[1], conv.input[2],
                       gate.input[1], gate.input[2], norm.input[1], conv.input[3], la.input[3]],
            "outputs": [norm.output[0], conv.output[1], la.output[1]],
            "la": la.name,
        }
    return blocks


def _shape_of(folder: Path) -> dict:
    """The attributes every block of the folder's model should get, read off its first block."""
    model = _load(folder)
    base = f"/model/layers.{_layers(model)[0]}/linear_attn"
    la, norm = _node(model, f"{base}/LinearAttention"), _node(model, f"{base}/GatedRMSNorm")
    flat = _node(model, f"{base}/q_l2norm/flat/Reshape")
    target = next(n for n in model.graph.node if n.output and n.output[0] == flat.input[1])  # a Constant node
    dk = int(onnx.numpy_helper.to_array(target.attribute[0].t)[3])
    dv = next(t for t in model.graph.initializer if t.name == norm.input[1]).dims[0]
    return {"num_k_heads": _attrs(la)["q_num_heads"], "num_v_heads": _attrs(la)["kv_num_heads"],
            "k_head_dim": dk, "v_head_dim": dv, "state_window": _attrs(la)["state_window"],
            "scale": F32(1 / math.sqrt(dk)), "epsilon": _attrs(norm)["epsilon"]}


def _check(model: onnx.ModelProto, folder: Path, scratch: Path) -> None:
    """onnx.checker on the model saved in `scratch` beside a copy of its external data from `folder`
    (the checker refuses a data file with several hard links, as the other tests' rewritten folders
    leave the fixtures'): topological order, names, types, attributes of the standard ops, external
    data where the references say. The genai graphs use ORT's
    SimplifiedLayerNormalization in the standard domain, which the checker does not know: it is
    given a schema for it first (the same attributes ORT's has)."""
    if not onnx.defs.has("SimplifiedLayerNormalization"):
        S = onnx.defs.OpSchema
        onnx.defs.register_schema(S(
            "SimplifiedLayerNormalization", "", 1,
            inputs=[S.FormalParameter("X", "T"), S.FormalParameter("scale", "T")],
            outputs=[S.FormalParameter("Y", "T"), S.FormalParameter("inv_std_var", "U", param_option=S.FormalParameterOption.Optional)],
            type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], ""),
                              ("U", ["tensor(float)"], "")],
            attributes=[S.Attribute("epsilon", S.AttrType.FLOAT, ""), S.Attribute("axis", S.AttrType.INT, ""),
                        S.Attribute("stash_type", S.AttrType.INT, "")]))
    scratch.mkdir(parents=True, exist_ok=True)
    for location in ops.rewrite.external_data_files(model):
        shutil.copyfile(folder / location, scratch / location)
    (scratch / "model.onnx").write_bytes(model.SerializeToString())
    onnx.checker.check_model(str(scratch / "model.onnx"))


# --------------------------------------------------------------------------------------------------
# The stand-in: ort_mtp::GatedDeltaNet as a model-local function of ORT's own ops


def _stand_in() -> onnx.FunctionProto:
    """GatedDeltaNet(...) computed by the com.microsoft subgraph it replaces, every size, head count
    and constant taken from the node's attributes (a wrong attribute changes the result)."""
    A = onnx.AttributeProto

    def ref(node_attribute: str, function_attribute: str, type_) -> onnx.AttributeProto:
        return A(name=node_attribute, ref_attr_name=function_attribute, type=type_)

    node = helper.make_node
    nodes = []
    for name in ("num_k_heads", "k_head_dim", "num_v_heads", "v_head_dim"):
        c = node("Constant", [], [name], name=f"c_{name}")
        c.attribute.append(ref("value_int", name, A.INT))
        nodes.append(c)
    nodes += [
        node("Constant", [], ["axis0"], value=helper.make_tensor("axis0", TensorProto.INT64, [1], [0])),
        node("Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.INT64, [1], [0])),
        node("Mul", ["num_k_heads", "k_head_dim"], ["kd0"]), node("Mul", ["num_v_heads", "v_head_dim"], ["vd0"]),
        node("Unsqueeze", ["kd0", "axis0"], ["kd"]), node("Unsqueeze", ["vd0", "axis0"], ["vd"]),
        node("Unsqueeze", ["num_k_heads", "axis0"], ["hk"]), node("Unsqueeze", ["k_head_dim", "axis0"], ["dk"]),
        node("Concat", ["kd", "kd", "vd"], ["sizes"], axis=0),
        node("Concat", ["zero", "zero", "hk", "dk"], ["flat"], axis=0),
        node("Concat", ["zero", "zero", "kd"], ["unflat"], axis=0),
        node("Transpose", ["qkv"], ["qkv_t"], perm=[0, 2, 1]),
    ]
    conv = node("CausalConvWithState", ["qkv_t", "conv_weight", "conv_bias", "past_conv"], ["conv", "present_conv"],
                domain=MS, ndim=1, activation="silu")
    conv.attribute.append(ref("state_window", "state_window", A.INT))
    nodes += [conv, node("Transpose", ["conv"], ["conv_t"], perm=[0, 2, 1]),
              node("Split", ["conv_t", "sizes"], ["q", "k", "v"], axis=-1)]
    for x in ("q", "k"):
        nodes += [node("Reshape", [x, "flat"], [f"{x}_flat"]),
                  node("LpNormalization", [f"{x}_flat"], [f"{x}_heads"], axis=-1, p=2),
                  node("Reshape", [f"{x}_heads", "unflat"], [f"{x}_norm"])]
    scale = node("Constant", [], ["scale32"])
    scale.attribute.append(ref("value_float", "scale", A.FLOAT))
    la = node("LinearAttention", ["q_scaled", "k_norm", "v", "past_recurrent", "decay", "beta"],
              ["o", "present_recurrent"], domain=MS, update_rule="gated_delta", scale=1.0)
    for attr, name in (("q_num_heads", "num_k_heads"), ("kv_num_heads", "num_v_heads"), ("state_window", "state_window")):
        la.attribute.append(ref(attr, name, A.INT))
    norm = node("GatedRMSNorm", ["o", "norm_weight", "z"], ["y"], domain=MS)
    norm.attribute.append(ref("epsilon", "epsilon", A.FLOAT))
    nodes += [scale, node("CastLike", ["scale32", "q_norm"], ["scale_t"]),
              node("Mul", ["q_norm", "scale_t"], ["q_scaled"]),
              node("LinearAttentionGate", ["a", "dt_bias", "neg_exp_A", "b"], ["decay", "beta"], domain=MS),
              la, norm]
    return helper.make_function(
        ops.DOMAIN, ops.linear_attention.GATED_DELTA_NET,
        ["qkv", "z", "a", "b", "conv_weight", "conv_bias", "dt_bias", "neg_exp_A", "norm_weight", "past_conv",
         "past_recurrent"], ["y", "present_conv", "present_recurrent"], nodes,
        [helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)], attributes=list(ATTRIBUTES))


def _with_stand_in(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.functions.append(_stand_in())
    return out


def _session(model: onnx.ModelProto, folder: Path, register: bool = False) -> ort.InferenceSession:
    """A CPU session for the model, its weights read from `folder`; ORT's own ops only unless `register`."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if register:
        ops.register(options)
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _forwards(model, folder: Path, steps=((1, 5, 7, 9, 11), (42,))) -> list[dict]:
    """Every graph output of a prefill and a decode step (states carried) on the CPU EP."""
    from driver.folder import read_folder

    session = model if isinstance(model, ort.InferenceSession) else _session(model, folder)
    spec = read_folder(folder).main
    names = [o.name for o in session.get_outputs()]
    carried = spec.kv + spec.recurrent
    state = {s.past: np.zeros(tuple(0 if d == -1 else d for d in s.shape), s.dtype) for s in carried}
    results, length = [], 0
    for ids in steps:
        width = len(ids)
        feeds = {spec.input_ids: np.asarray([ids], np.int64),
                 spec.attention_mask: np.ones((1, length + width), np.int64),
                 spec.position_ids: np.tile(np.arange(length, length + width, dtype=np.int64), (3, 1, 1)), **state}
        result = dict(zip(names, session.run(None, feeds)))
        state = {s.past: result[s.present] for s in carried}
        length += width
        results.append(result)
    return results


def _assert_same_forwards(want: list[dict], got: list[dict]) -> None:
    for w, g in zip(want, got):
        assert w.keys() == g.keys()
        for name in w:
            np.testing.assert_array_equal(g[name], w[name], err_msg=name)


# --------------------------------------------------------------------------------------------------
# Every block, three folders


@pytest.fixture(scope="module")
def folders(tiny_folder, builder_folder, builder_windowed_folder) -> dict[str, Path]:
    return {"tiny": tiny_folder, "builder-cpu": builder_folder, "builder-cuda-w4": builder_windowed_folder}


@pytest.mark.parametrize("which", ["tiny", "builder-cpu", "builder-cuda-w4"])
def test_every_block_becomes_one_gated_delta_net(which, folders, tmp_path):
    folder = folders[which]
    model = _load(folder)
    expected, shape = _expected_blocks(model), _shape_of(folder)
    assert len(expected) == len(_layers(model)) >= 3
    initializers = {t.name: t.SerializeToString() for t in model.graph.initializer}
    in_block = lambda n: "/linear_attn/" in n.name and "MatMul" not in n.name  # noqa: E731
    block_only = {o for n in model.graph.node if n.op_type == "Constant" for o in n.output
                  if all(in_block(u) for u in model.graph.node if o in u.input)}  # constants only blocks read
    others = {(n.name, n.op_type) for n in model.graph.node if not in_block(n) and n.output[0] not in block_only}
    assert len(block_only) == 4  # split sizes, the two reshape targets, the q scale: dropped with the blocks
    report = rewrite_model_report(model, rewrites=[LINEAR_ATTENTION])

    blocks = report.linear_attention
    assert blocks.rewritten == [b["la"] for b in expected.values()] and blocks.kept == [] and report.count == 0
    ours = {n.name: n for n in model.graph.node if n.domain == ops.DOMAIN}
    assert set(ours) == set(expected)
    for name, node in ours.items():
        assert node.op_type == "GatedDeltaNet"
        assert list(node.input) == expected[name]["inputs"] and list(node.output) == expected[name]["outputs"]
        attrs = _attrs(node)
        assert set(attrs) == set(ATTRIBUTES)
        assert {k: attrs[k] for k in ATTRIBUTES} == shape, name
    if which == "builder-cuda-w4":  # the fp16 CUDA export: windowed states, fp16 q scale (0.25 exactly)
        assert shape["state_window"] == 4
        assert next(i for i in model.graph.input if i.name == "past.0.conv").type.tensor_type.elem_type \
            == TensorProto.FLOAT16
    # nothing of a block is left; every other node and every initializer is as it was
    assert not any(n.op_type in BLOCK_OPS for n in model.graph.node)
    assert {n.op_type for n in model.graph.node if "/linear_attn/" in n.name} == {"MatMulNBits", "MatMul", "GatedDeltaNet"}
    assert {(n.name, n.op_type) for n in model.graph.node if n.domain != ops.DOMAIN} == others
    assert {t.name: t.SerializeToString() for t in model.graph.initializer} == initializers
    assert any(o.domain == ops.DOMAIN and o.version == 1 for o in model.opset_import)
    # the rewritten graph checks (topological order, names, external data in the folder)
    _check(model, folder, tmp_path / "check")


def test_no_weight_is_read(tiny_folder, tmp_path):
    """The rewrite works on the graph file alone: its external data is not there to be read, and every
    initializer stays an external reference to the same bytes."""
    shutil.copy2(tiny_folder / "model.onnx", tmp_path / "model.onnx")
    model = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    before = {t.name: t.SerializeToString() for t in model.graph.initializer}
    report = rewrite_model_report(model, base_dir=tmp_path)
    assert len(report.linear_attention.rewritten) == 6 and report.count > 0
    after = {t.name: t for t in model.graph.initializer}
    assert all(t.data_location == TensorProto.EXTERNAL and not t.raw_data for t in after.values())
    assert {name: t.SerializeToString() for name, t in after.items()} == before


def test_a_damaged_constant_keeps_its_block_with_the_reason(tiny_folder, tmp_path):
    """A Constant node with no attribute onnx-ir knows (a damaged file: 'value' renamed, as a byte flip
    in a byte fuzz of the model did): the blocks that read it (the builder shares one split-sizes
    constant between them) stay as they were, with the reason, and the rest of the rewrite goes on."""
    shutil.copy2(tiny_folder / "model.onnx", tmp_path / "model.onnx")
    model = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    split = next(n for n in model.graph.node if n.op_type == "Split" and "/linear_attn/" in n.name)
    constant = next(n for n in model.graph.node if n.op_type == "Constant" and n.output[0] == split.input[1])
    constant.attribute[0].name = "?alue"
    report = rewrite_model_report(model, base_dir=tmp_path)
    kept = report.linear_attention.kept
    assert len(kept) >= 1 and all("cannot be read" in why for _, why in kept), kept
    assert len(report.linear_attention.rewritten) + len(kept) == len(_layers(_load(tiny_folder)))
    assert report.rewritten  # the MatMulNBits nodes


@pytest.mark.parametrize("which", ["tiny", "builder-cpu"])
def test_the_rewritten_model_computes_what_the_original_computes(which, folders):
    """Through the stand-in: prefill and decode outputs (logits, hidden states, every present state)
    bit-identical to the original graph's."""
    folder = folders[which]
    original = _load(folder)
    rewritten = _load(folder)
    assert len(rewrite_model_report(rewritten, rewrites=[LINEAR_ATTENTION]).linear_attention.rewritten) \
        == len(_layers(original))
    _assert_same_forwards(_forwards(original, folder), _forwards(_with_stand_in(rewritten), folder))


@pytest.mark.parametrize("variant", ["constant_first", "no_mul_default_scale", "no_mul_explicit_scale"])
def test_the_q_scale_written_otherwise(variant, tiny_folder):
    """The q scale as a Mul with the constant first, or left to LinearAttention's `scale` (0, its default
    1/sqrt(dk), or a value): every block still matches, with the scale LinearAttention applies in the end."""
    original = _load(tiny_folder)
    for layer in _layers(original):
        base = f"/model/layers.{layer}/linear_attn"
        mul, la = _node(original, f"{base}/q_scaled/Mul"), _node(original, f"{base}/LinearAttention")
        if variant == "constant_first":
            mul.input[0], mul.input[1] = mul.input[1], mul.input[0]
        else:
            la.input[0] = mul.input[0]
            original.graph.node.remove(mul)
            _set_attr(la, "scale", 0.0 if variant == "no_mul_default_scale" else 0.125)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(original)
    report = rewrite_model_report(rewritten, rewrites=[LINEAR_ATTENTION]).linear_attention
    assert len(report.rewritten) == 6 and report.kept == []
    scales = {_attrs(n)["scale"] for n in rewritten.graph.node if n.op_type == "GatedDeltaNet"}
    assert scales == {F32(0.125) if variant == "no_mul_explicit_scale" else F32(1 / math.sqrt(32))}
    want, got = _forwards(original, tiny_folder), _forwards(_with_stand_in(rewritten), tiny_folder)
    if variant == "constant_first":
        _assert_same_forwards(want, got)
    else:  # LinearAttention scales its output, the stand-in (as the op) scales q: float32 rounding apart
        for w, g in zip(want, got):
            np.testing.assert_allclose(g["logits"], w["logits"], rtol=1e-5, atol=1e-5 * np.abs(w["logits"]).max())


# --------------------------------------------------------------------------------------------------
# Blocks that do not fit: kept, reported, and the graph still runs


def _set_attr(node, name, value):
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, value))


def _mutate(kind: str, model: onnx.ModelProto) -> None:
    base = "/model/layers.1/linear_attn"
    if kind == "update_rule":
        _set_attr(_node(model, f"{base}/LinearAttention"), "update_rule", "gated")
    elif kind == "outside_use":  # the conv output read outside the block, as an extra graph output
        value = f"{base}/conv_out/Transpose/output_0"
        model.graph.node.append(helper.make_node("Identity", [value], ["conv_probe"], name="/probe/Identity"))
        model.graph.output.append(helper.make_tensor_value_info("conv_probe", TensorProto.FLOAT,
                                                                ["batch_size", "sequence_length", 256]))
    elif kind == "conv_activation":
        _set_attr(_node(model, f"{base}/CausalConvWithState"), "activation", "none")
    elif kind == "norm_over_all_heads":  # GatedRMSNorm over the whole value vector, not per head
        norm = _node(model, f"{base}/GatedRMSNorm")
        width = 4 * 32  # tiny: 4 value heads of 32
        weight = onnx.numpy_helper.from_array(np.ones(width, np.float32), "whole_norm_weight")
        model.graph.initializer.append(weight)
        norm.input[1] = "whole_norm_weight"
    elif kind == "q_scale_input":  # the q scale computed, not a constant
        mul = _node(model, f"{base}/q_scaled/Mul")
        model.graph.node.insert(list(model.graph.node).index(mul), helper.make_node(
            "Identity", [mul.input[1]], ["computed_scale"], name="/probe/scale"))
        mul.input[1] = "computed_scale"


@pytest.mark.parametrize("kind,reason", [
    ("update_rule", "/model/layers.1/linear_attn/LinearAttention: update_rule 'gated' is not supported"),
    ("outside_use", "/model/layers.1/linear_attn/conv_out/Transpose/output_0 (an output of "
                    "/model/layers.1/linear_attn/conv_out/Transpose, inside the block) is also read by "
                    "/probe/Identity, outside the block"),
    ("conv_activation", "/model/layers.1/linear_attn/CausalConvWithState: activation 'none' is not supported"),
    ("norm_over_all_heads", "/model/layers.1/linear_attn/GatedRMSNorm: the norm weight (whole_norm_weight) has "
                            "shape [128], expected [32]"),
    ("q_scale_input", "/model/layers.1/linear_attn/q_scaled/Mul: the q scale (computed_scale) is not a constant"),
])
def test_a_block_that_does_not_fit_is_kept_with_the_reason(kind, reason, tiny_folder, tmp_path):
    original = _load(tiny_folder)
    _mutate(kind, original)
    model = onnx.ModelProto()
    model.CopyFrom(original)
    report = rewrite_model_report(model, rewrites=[LINEAR_ATTENTION]).linear_attention
    kept = "/model/layers.1/linear_attn/LinearAttention"
    assert len(report.rewritten) == 5 and kept not in report.rewritten
    assert len(report.kept) == 1 and report.kept[0][0] == kept
    assert reason in report.kept[0][1], report.kept[0][1]
    # the kept block is every one of its nodes, as it was
    block = {n.name: n.SerializeToString() for n in original.graph.node if n.name.startswith("/model/layers.1/")}
    assert {n.name: n.SerializeToString() for n in model.graph.node if n.name.startswith("/model/layers.1/")} == block
    _check(model, tiny_folder, tmp_path / "check")
    # it runs: the kept block on ORT's ops, the others through the stand-in, as the mutated original
    _assert_same_forwards(_forwards(original, tiny_folder), _forwards(_with_stand_in(model), tiny_folder))


def test_a_block_without_its_norm_is_kept(tiny_folder):
    model = _load(tiny_folder)
    norm = _node(model, "/model/layers.2/linear_attn/GatedRMSNorm")
    norm.op_type, norm.domain = "SimplifiedLayerNormalization", ""  # not the block's last node any more
    del norm.input[2]
    report = rewrite_model_report(model, rewrites=[LINEAR_ATTENTION]).linear_attention
    assert report.kept == [("/model/layers.2/linear_attn/LinearAttention",
                            "/model/layers.2/linear_attn/LinearAttention: its output is not read by a com.microsoft "
                            "GatedRMSNorm, the block's last node")]


def test_include_exclude_and_only(tiny_folder):
    model = _load(tiny_folder)
    layer4 = sum(n.op_type == "MatMulNBits" and n.name.startswith("/model/layers.4/") for n in model.graph.node)
    report = rewrite_model_report(model, ops.rewrite.NodeFilter(include="/model/layers.4/*"))
    assert report.linear_attention.rewritten == ["/model/layers.4/linear_attn/LinearAttention"]
    assert report.linear_attention.filtered_out == 5 and report.linear_attention.kept == []
    assert report.count == layer4 == 6 and report.filtered_out == 47 - 6  # layer 4's MatMulNBits too
    model = _load(tiny_folder)
    report = rewrite_model_report(model, ops.rewrite.NodeFilter(exclude="*/linear_attn/LinearAttention"))
    assert report.linear_attention.filtered_out == 6 and report.count == 47
    model = _load(tiny_folder)
    report = rewrite_model_report(model, rewrites=[MATMUL])
    assert report.linear_attention.total == 0 and report.count == 47
    assert sum(n.op_type == "LinearAttention" for n in model.graph.node) == 6
    with pytest.raises(ops.rewrite.RewriteError, match="unknown rewrite 'swiglu'"):
        rewrite_model_report(_load(tiny_folder), rewrites=["swiglu"])


def test_a_library_without_the_op_keeps_every_block(tiny_folder):
    model = _load(tiny_folder)
    before = model.SerializeToString()
    report = rewrite_model_report(model, rewrites=[LINEAR_ATTENTION], gated_delta_net=lambda sig: "no kernel here")
    assert report.linear_attention.rewritten == [] and len(report.linear_attention.kept) == 6
    assert {why for _, why in report.linear_attention.kept} == {"no kernel here"}
    assert model.SerializeToString() == before


# --------------------------------------------------------------------------------------------------
# python -m ops rewrite


@pytest.fixture
def op_present(monkeypatch):
    """The library counts as having GatedDeltaNet (only the rewriter asks it here: nothing is run)."""
    monkeypatch.setattr(ops.linear_attention, "available", lambda *args, **kwargs: None)


def test_cli_reports_blocks(tiny_folder, tmp_path, capsys, op_present):
    assert cli_main(["rewrite", str(tiny_folder), str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "model.onnx: rewrote 47 of 47 MatMulNBits nodes" in out
    assert "model.onnx: rewrote 6 of 6 linear-attention blocks into ort_mtp GatedDeltaNet" in out
    rewritten = onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False)
    assert sum(n.op_type == "GatedDeltaNet" for n in rewritten.graph.node) == 6
    assert (tmp_path / "out" / "model.onnx.data").samefile(tiny_folder / "model.onnx.data")

    source = tmp_path / "mutated"
    shutil.copytree(tiny_folder, source, copy_function=lambda s, d: Path(d).hardlink_to(s))
    model = _load(source)
    _mutate("update_rule", model)
    (source / "model.onnx").unlink()
    (source / "model.onnx").write_bytes(model.SerializeToString())
    assert cli_main(["rewrite", str(source), str(tmp_path / "out2"), "--only", "linear-attention"]) == 0
    captured = capsys.readouterr()
    assert "model.onnx: rewrote 5 of 6 linear-attention blocks" in captured.out
    assert "MatMulNBits" not in captured.out
    assert ("warning: model.onnx: kept linear-attention block '/model/layers.1/linear_attn/LinearAttention' on "
            "com.microsoft ops: update_rule 'gated' is not supported") in captured.err


def test_cli_with_the_installed_library(tiny_folder, tmp_path, capsys):
    """What the library really has decides: every block on GatedDeltaNet, or every block kept with one
    warning saying the library has no kernel (the folder then runs as before)."""
    missing = ops.linear_attention.available(ops.library_path())
    assert cli_main(["rewrite", str(tiny_folder), str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    if missing is None:
        assert "rewrote 6 of 6 linear-attention blocks" in captured.out
    else:
        assert "has no ort_mtp::GatedDeltaNet kernel for the CPU EP (float32)" in missing
        assert "rewrote 0 of 6 linear-attention blocks" in captured.out
        assert captured.err.count("\n") == 1 and f"kept 6 linear-attention blocks" in captured.err
        assert missing in captured.err


def test_cuda_probe_session_is_one_onnx_runtime_accepts(monkeypatch):
    """The CUDA check's one-node session must be refused only for a missing kernel. ORT refuses
    `session.disable_cpu_ep_fallback` beside an explicitly listed CPU EP ("Conflicting session
    configuration"), which once made every CUDA check answer "no kernel" on a GPU that had it. Here
    (no usable GPU: the CUDA EP cannot load or does not claim the node) the node lands on the CPU EP,
    so the answer must be ORT's fallback refusal, classified as a missing CUDA kernel, and nothing else."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this ONNX Runtime build has no CUDA EP: the CUDA check stops before the probe session")
    monkeypatch.setattr(ops.probe, "visible_gpus", lambda: ["GPU 0 (pretended)"])
    refusals = []

    def session(*args, **kwargs):
        try:
            return real_session(*args, **kwargs)
        except Exception as e:
            refusals.append(str(e))
            raise

    real_session = ort.InferenceSession
    monkeypatch.setattr(ort, "InferenceSession", session)
    t = onnx_ir.DataType
    signature = ops.linear_attention.Signature(t.FLOAT16, t.FLOAT16, t.FLOAT, t.FLOAT, True)
    answer = ops.linear_attention._available.__wrapped__(
        ops.library_path(), 0, "cuda", tuple(int(x) for x in signature), 0)
    if answer is not None:  # None: a usable GPU after all, whose CUDA EP took the node
        assert len(refusals) == 1 and "fallback to CPU EP has been explicitly disabled" in refusals[0], refusals
        assert answer == ("libort_mtp_ops.so has no ort_mtp::GatedDeltaNet kernel for the CUDA EP "
                          "(float16, state_window)")


def test_cli_only_linear_attention_with_nothing_to_rewrite(tmp_path, capsys, op_present):
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]))
    onnx.save(model, str(tmp_path / "m.onnx"))
    assert cli_main(["rewrite", str(tmp_path / "m.onnx"), str(tmp_path / "o.onnx"), "--only", "linear-attention"]) == 2
    assert "has no linear-attention block" in capsys.readouterr().err


def test_folder_rewrite_asks_the_library_it_copies_in(tiny_folder, builder_windowed_folder, tmp_path, monkeypatch):
    """On the EP the folder's genai_config names, with each block's types: the CPU for the tiny preset,
    CUDA (fp16 blocks, windowed state) for the builder's CUDA export."""
    asked = []

    def available(library, provider="cpu", signature=None, device_id=0):
        asked.append((library, provider, signature.describe(), device_id))
        return "not this one"

    monkeypatch.setattr(ops.linear_attention, "available", available)
    report = rewrite_folder(tiny_folder, tmp_path / "out", library=ops.library_path())
    assert report.models["model.onnx"].linear_attention.kept[0][1] == "not this one"
    assert set(asked) == {(ops.library_path(), "cpu", "float32", 0)}
    asked.clear()
    report = rewrite_folder(builder_windowed_folder, tmp_path / "out2", library=ops.library_path())
    assert len(report.models["model.onnx"].linear_attention.kept) == 3
    assert set(asked) == {(ops.library_path(), "cuda", "float16, state_window", 0)}


# --------------------------------------------------------------------------------------------------
# The driver: in memory, by default, only where the op runs on the device


def test_driver_rewrites_in_memory(tiny_folder, op_present):
    from driver.device import CpuDevice
    from driver.folder import read_folder
    from driver.sessions import rewrite_graph

    spec = read_folder(tiny_folder).main
    before = spec.proto.SerializeToString()
    proto, report = rewrite_graph(spec, True, CpuDevice())
    assert len(report.linear_attention.rewritten) == 6 and report.count == 47
    assert sum(n.op_type == "GatedDeltaNet" and n.domain == ops.DOMAIN for n in proto.graph.node) == 6
    assert all(t.data_location == TensorProto.EXTERNAL for t in proto.graph.initializer)
    assert spec.proto.SerializeToString() == before  # the folder's graph is not touched
    proto, report = rewrite_graph(spec, ["matmul"], CpuDevice())
    assert report.linear_attention.total == 0 and report.count == 47
    proto, report = rewrite_graph(spec, False, CpuDevice())
    assert proto.SerializeToString() == before and not report.changed


def test_driver_keeps_blocks_the_library_cannot_run(tiny_folder, monkeypatch, caplog):
    from driver.device import CpuDevice
    from driver.folder import read_folder
    from driver.sessions import rewrite_graph

    monkeypatch.setattr(ops.linear_attention, "available", lambda *a, **k: "no GatedDeltaNet kernel here")
    spec = read_folder(tiny_folder).main
    with caplog.at_level(logging.INFO, logger="driver.sessions"):
        proto, report = rewrite_graph(spec, True, CpuDevice())
    assert report.linear_attention.rewritten == [] and len(report.linear_attention.kept) == 6
    assert sum(n.op_type == "LinearAttention" for n in proto.graph.node) == 6
    assert {r.levelno for r in caplog.records} == {logging.INFO}  # the library's answer, not a warning


# --------------------------------------------------------------------------------------------------
# The real op (runs when the library registers ort_mtp::GatedDeltaNet)


@pytest.fixture(scope="module")
def real_op():
    missing = ops.linear_attention.available(ops.library_path())
    if missing:
        pytest.skip(f"the end-to-end test needs the op: {missing}")


def test_real_op_generates_the_tokens_of_onnx_runtimes_ops(tiny_folder, real_op):
    """The tiny preset greedy, its blocks on GatedDeltaNet against the same driver with the blocks on
    ORT's ops (MatMulNBits on ours in both, so only the linear attention differs): the same tokens,
    and logits within float32 rounding of each other."""
    from driver import Generator

    ours = Generator(tiny_folder, provider="cpu", mode="greedy", max_length=96, threads=1)
    theirs = Generator(tiny_folder, provider="cpu", mode="greedy", max_length=96, threads=1, rewrite=[MATMUL])
    for prompt in ([1, 5, 7, 9, 11], [300, 2, 77], list(range(40, 70))):
        assert ours.generate(prompt, 24, stop_at_eos=False).tokens == theirs.generate(prompt, 24, stop_at_eos=False).tokens
    original, rewritten = _load(tiny_folder), _load(tiny_folder)
    assert len(rewrite_model_report(rewritten, rewrites=[LINEAR_ATTENTION]).linear_attention.rewritten) == 6
    want = _forwards(original, tiny_folder)
    got = _forwards(_session(rewritten, tiny_folder, register=True), tiny_folder)
    for w, g in zip(want, got):
        for name in ("logits", "hidden_states"):
            np.testing.assert_allclose(g[name], w[name], rtol=1e-4, atol=1e-4 * np.abs(w[name]).max(), err_msg=name)
