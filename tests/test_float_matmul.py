"""ort_mtp::MatMul on the CPU EP: against its float64 reference and ONNX Runtime's MatMul (the node it
replaces), an M-row call bit-identical to M one-row calls at every thread count, its errors naming
the node, the two-weight node bit-identical to two one-weight nodes; and the float-matmul rewrite
(ops.float_matmul): the a/b projections of our folders and the builder's move onto it, pairs reading
one input merge into two-weight nodes, what is kept and why.

Tolerances (u_T the unit roundoff: 2^-24 float32, 2^-11 float16, 2^-8 bfloat16): the kernel sums K
float32 products in order, so |y - exact| <= K u_32 sum_k |a_k b_k| (the classic bound for recursive
summation), plus the output's own rounding to T, u_T |y|. ORT's MatMul sums in another order: twice
the float32 part, and one rounding of T each.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ops
import ops.float_matmul as fm
from ops.float_matmul import MAX_N
from ops.nbits import UNIT_ROUNDOFF
from ops.rewrite import FLOAT_MATMUL, float_matmul_check, rewrite_model_report

NODE = "/model/layers.1/linear_attn/b_proj/MatMul"
LABEL = f"MatMul node '{NODE}'"
U = UNIT_ROUNDOFF


def _representable(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values that T holds exactly (so the float32 graph values cast to T are these values)."""
    x = np.asarray(x, np.float32)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return (x.view(np.uint32) & 0xFFFF0000).view(np.float32)
    return x


def _session(model, threads: int = 0):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    options.register_custom_ops_library(ops.library_path())
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _case(rng, k, n, m, dtype):
    a = _representable(rng.standard_normal((1, m, k)), dtype)
    b = _representable(rng.standard_normal((k, n)) / np.sqrt(k), dtype)
    return a, b


def _bound(a, b, dtype, orders: int = 1):
    exact = fm.reference(a, b)
    summed = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    return exact, orders * a.shape[-1] * U["float32"] * summed + (2 ** (orders - 1)) * U[dtype] * np.abs(exact) + 1e-30


SHAPES = [(1, 1), (7, 3), (16, 16), (33, 17), (64, 48), (300, 50), (1024, 16), (130, 257)]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("k,n", SHAPES)
def test_matches_reference_and_rows_do_not_depend_on_m(k, n, dtype):
    rng = np.random.default_rng(k * 1000 + n)
    m = 9
    a, b = _case(rng, k, n, m, dtype)
    session = _session(fm.model(k, n, dtype, weight=b, node_name=NODE, float32_io=True))
    y = session.run(None, {"A": a})[0]
    exact, bound = _bound(a, b, dtype)
    assert np.all(np.abs(y - exact) <= bound), float(np.max(np.abs(y - exact) / bound))
    # Row by row and in every split of the rows: the same bits.
    rows = np.concatenate([session.run(None, {"A": a[:, i:i + 1]})[0] for i in range(m)], axis=1)
    assert np.array_equal(rows, y)
    assert np.array_equal(session.run(None, {"A": a[:, 2:7]})[0], y[:, 2:7])


def test_rows_do_not_depend_on_thread_count_or_batch_layout():
    rng = np.random.default_rng(5)
    k, n = 515, 97
    a, b = _case(rng, k, n, 12, "float32")
    model = fm.model(k, n, "float32", weight=b)
    results = [_session(model, threads).run(None, {"A": a})[0] for threads in (1, 2, 3)]
    assert all(np.array_equal(results[0], r) for r in results[1:])
    # [3, 4, K] holds the same 12 rows: the same bits.
    assert np.array_equal(_session(model).run(None, {"A": a.reshape(3, 4, k)})[0].reshape(1, 12, n), results[0])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_agrees_with_onnx_runtime_matmul(dtype):
    rng = np.random.default_rng(11)
    k, n, m = 640, 48, 5
    a, b = _case(rng, k, n, m, dtype)
    feeds = {"A": a.astype(dtype)}
    ours = _session(fm.model(k, n, dtype, weight=b.astype(dtype))).run(None, feeds)[0].astype(np.float64)
    theirs = _session(fm.model(k, n, dtype, weight=b.astype(dtype), domain="")).run(None, feeds)[0].astype(np.float64)
    _, bound = _bound(a, b, dtype, orders=2)
    assert np.all(np.abs(ours - theirs) <= bound)


def test_one_dimensional_a_and_empty_extents(cpu_session):
    rng = np.random.default_rng(3)
    b = rng.standard_normal((6, 4)).astype(np.float32)
    model = fm.model(6, 4, weight=b)
    model.graph.input[0].type.tensor_type.shape.ClearField("dim")
    model.graph.input[0].type.tensor_type.shape.dim.add().dim_param = "k"
    model.graph.output[0].type.tensor_type.shape.ClearField("dim")
    model.graph.output[0].type.tensor_type.shape.dim.add().dim_param = "n"
    a = rng.standard_normal(6).astype(np.float32)
    y = cpu_session(model).run(None, {"A": a})[0]
    assert y.shape == (4,) and np.allclose(y, a @ b, rtol=1e-5)
    empty = cpu_session(fm.model(6, 4, weight=b)).run(None, {"A": np.zeros((0, 3, 6), np.float32)})[0]
    assert empty.shape == (0, 3, 4)
    zero_k = cpu_session(fm.model(0, 4, weight=np.zeros((0, 4), np.float32))).run(
        None, {"A": np.zeros((1, 2, 0), np.float32)})[0]
    assert zero_k.shape == (1, 2, 4) and not zero_k.any()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("k,n,n2", [(64, 48, 48), (300, 50, 7), (33, 16, 24), (130, 1, 257)])
def test_two_weights_give_what_two_nodes_give(k, n, n2, dtype):
    rng = np.random.default_rng(k + n + n2)
    a, b = _case(rng, k, n, 6, dtype)
    b2 = _representable(rng.standard_normal((k, n2)) / np.sqrt(k), dtype)
    both = _session(fm.model(k, n, dtype, weight=b, weight2=b2, node_name=NODE, float32_io=True))
    one = _session(fm.model(k, n, dtype, weight=b, float32_io=True)).run(None, {"A": a})[0]
    two = _session(fm.model(k, n2, dtype, weight=b2, float32_io=True)).run(None, {"A": a})[0]
    y, y2 = both.run(None, {"A": a})
    assert y.shape == (1, 6, n) and y2.shape == (1, 6, n2)
    assert np.array_equal(y, one) and np.array_equal(y2, two)
    rows = [both.run(None, {"A": a[:, i:i + 1]}) for i in range(6)]  # and rows still do not depend on M
    assert np.array_equal(np.concatenate([r[0] for r in rows], 1), y)
    assert np.array_equal(np.concatenate([r[1] for r in rows], 1), y2)


def test_two_weights_with_an_empty_one(cpu_session):
    rng = np.random.default_rng(2)
    b = rng.standard_normal((8, 5)).astype(np.float32)
    a = rng.standard_normal((1, 3, 8)).astype(np.float32)
    y, y2 = cpu_session(fm.model(8, 0, weight=np.zeros((8, 0), np.float32), weight2=b)).run(None, {"A": a})
    assert y.shape == (1, 3, 0) and np.allclose(y2, a @ b, rtol=1e-5)


def test_two_weight_errors_name_the_node(cpu_session):
    a = np.ones((1, 2, 6), np.float32)
    model = fm.model(6, 4, node_name=NODE, n2=3, b2_shape=["k2", "n2"])
    for out in model.graph.output:
        out.type.tensor_type.shape.ClearField("dim")
    session = cpu_session(model)
    with pytest.raises(Exception, match="input B2 has shape \\[5, 3\\], expected \\[K, N\\] with K A's last extent"):
        session.run(None, {"A": a, "B": np.ones((6, 4), np.float32), "B2": np.ones((5, 3), np.float32)})
    lonely = fm.model(6, 4, node_name=NODE, n2=3)
    del lonely.graph.node[0].output[1]  # B2 without its output Y2
    del lonely.graph.output[1]
    with pytest.raises(Exception, match="3 inputs need 2 outputs"):
        cpu_session(lonely)


@pytest.mark.parametrize("change,message", [
    ("b_rank", "input B has shape [2, 6, 4], expected a matrix [K, N]"),
    ("k", "input B has shape [5, 4], expected [K, N] with K A's last extent"),
    ("b_type", "input B is float16, expected float32"),
    ("y_type", "output Y"),
])
def test_errors_name_the_node(cpu_session, change, message):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, 2, 6)).astype(np.float32)
    shapes = {"b_rank": (2, 6, 4), "k": (5, 4)}
    b = rng.standard_normal(shapes.get(change, (6, 4))).astype(np.float32)
    model = fm.model(6, 4, node_name=NODE, b_shape=["b0", "b1", "b2"] if change == "b_rank" else ["k", "n"])
    model.graph.output[0].type.tensor_type.shape.ClearField("dim")
    if change == "b_type":
        model.graph.input[1].type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
        b = b.astype(np.float16)
    if change == "y_type":
        model.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    with pytest.raises(Exception) as info:
        session = cpu_session(model)
        session.run(None, {"A": a, "B": b})
    text = str(info.value)
    if change in ("b_type", "y_type"):
        # ORT refuses a type no kernel of the op takes when it places the node, naming the op.
        assert "MatMul" in text
    else:
        assert LABEL in text and message in text


# --------------------------------------------------------------------------------------------------
# The rewrite


def _load(folder):
    return onnx.load(str(folder / "model.onnx"), load_external_data=False)


def _dense(model, domain=""):
    return [n for n in model.graph.node if n.op_type == "MatMul" and n.domain == domain]


def test_tiny_preset_gate_projections_move_to_our_op(tiny_folder, cpu_session):
    model = _load(tiny_folder)
    before = [n.name for n in _dense(model)]
    assert before and all(n.endswith(("a_proj/MatMul", "b_proj/MatMul")) for n in before)
    report = rewrite_model_report(model, rewrites=[FLOAT_MATMUL], base_dir=tiny_folder,
                                  float_matmul=float_matmul_check())
    assert sorted(report.float_matmul.rewritten) == sorted(before) and report.float_matmul.kept == []
    assert report.count == 0 and report.linear_attention.total == 0  # only the kind asked for
    # Each layer's a and b projections read the same normed hidden: one two-weight node per layer,
    # the outputs under their old names.
    ours = _dense(model, "ort_mtp")
    assert not _dense(model) and len(ours) == len(before) // 2
    assert sorted(report.float_matmul_merged) == sorted(n.name for n in ours)
    assert sorted(part for n in ours for part in n.name.split("+")) == sorted(before)
    assert all(len(n.input) == 3 and len(n.output) == 2 for n in ours)
    assert sorted(o for n in ours for o in n.output) == sorted(o for n in _dense(_load(tiny_folder)) for o in n.output)


def _shared_input_model(k=40, seed=4):
    """Three ONNX MatMuls: P and Q read A, R reads P's output; P's output is also a graph output."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weights = {name: rng.standard_normal(shape).astype(np.float32)
               for name, shape in {"WP": (k, 8), "WQ": (k, 16), "WR": (8, 4)}.items()}
    nodes = [helper.make_node("MatMul", ["A", "WP"], ["P"], name="p"),
             helper.make_node("Relu", ["A"], ["A2"], name="relu"),
             helper.make_node("MatMul", ["P", "WR"], ["R"], name="r"),
             helper.make_node("MatMul", ["A", "WQ"], ["Q"], name="q")]
    graph = helper.make_graph(
        nodes, "shared", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["b", "s", k])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("P", "Q", "R", "A2")],
        initializer=[numpy_helper.from_array(w, name) for name, w in weights.items()])
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)])


def test_matmuls_reading_one_input_merge_and_compute_the_same_bits(monkeypatch):
    model = _shared_input_model()
    report = rewrite_model_report(model, rewrites=[FLOAT_MATMUL], float_matmul=float_matmul_check())
    assert sorted(report.float_matmul.rewritten) == ["p", "q", "r"] and report.float_matmul_merged == ["p+q"]
    merged = {n.name: n for n in model.graph.node}
    assert list(merged["p+q"].input) == ["A", "WP", "WQ"] and list(merged["p+q"].output) == ["P", "Q"]
    assert merged["r"].domain == "ort_mtp" and list(merged["r"].input) == ["P", "WR"]  # alone: nothing to pair
    known = {"A", "WP", "WQ", "WR"}
    for node in model.graph.node:  # still topologically sorted
        assert set(node.input) <= known, node.name
        known |= set(node.output)
    # The same graph rewritten without the merge: the same outputs, bit for bit.
    monkeypatch.setattr(fm, "merge_shared_inputs", lambda view: [])
    unmerged = _shared_input_model()
    assert rewrite_model_report(unmerged, rewrites=[FLOAT_MATMUL]).float_matmul_merged == []
    a = np.random.default_rng(9).standard_normal((2, 3, 40)).astype(np.float32)
    for got, want in zip(_session(model).run(None, {"A": a}), _session(unmerged).run(None, {"A": a})):
        assert np.array_equal(got, want)


def test_builder_folder_gate_projections_move_to_our_op(builder_folder):
    model = _load(builder_folder)
    before = [n.name for n in _dense(model)]
    assert before
    report = rewrite_model_report(model, rewrites=[FLOAT_MATMUL], base_dir=builder_folder,
                                  float_matmul=float_matmul_check())
    assert sorted(report.float_matmul.rewritten) == sorted(before)


def test_kept_matmuls_say_why():
    rng = np.random.default_rng(1)
    cases = {
        "activation B": fm.model(8, 4, node_name="x"),                      # B is a graph input
        "wide": fm.model(8, MAX_N + 1, weight=rng.standard_normal((8, MAX_N + 1)).astype(np.float32), node_name="x"),
        "int": fm.model(8, 4, node_name="x"),
    }
    for model in cases.values():
        model.graph.node[0].domain = ""
    cases["int"].graph.input[1].type.tensor_type.elem_type = onnx.TensorProto.INT32
    cases["int"].graph.initializer.append(onnx.numpy_helper.from_array(np.ones((8, 4), np.int32), "B"))
    reasons = {}
    for name, model in cases.items():
        report = rewrite_model_report(model, rewrites=[FLOAT_MATMUL], float_matmul=float_matmul_check())
        assert report.float_matmul.rewritten == [] and len(report.float_matmul.kept) == 1
        reasons[name] = report.float_matmul.kept[0][1]
    assert "B (B) is not a constant weight" in reasons["activation B"]
    assert f"N = {MAX_N + 1} columns, more than the {MAX_N}" in reasons["wide"]
    assert "not float32, float16 or bfloat16" in reasons["int"]


def test_no_cuda_kernel_keeps_the_node_with_the_library_s_reason(library_path):
    # On a machine without a GPU the probe says why; the node stays ONNX MatMul.
    if ops.visible_gpus():
        pytest.skip("a GPU is visible: the CUDA kernel would be probed for real (tests/gpu covers it)")
    model = fm.model(8, 4, weight=np.ones((8, 4), np.float32), node_name="x")
    model.graph.node[0].domain = ""
    report = rewrite_model_report(model, rewrites=[FLOAT_MATMUL],
                                  float_matmul=float_matmul_check(library_path, "cuda"))
    assert report.float_matmul.rewritten == [] and len(report.float_matmul.kept) == 1
    assert "CUDA" in report.float_matmul.kept[0][1]


def test_cli_only_float_matmul(tiny_folder, tmp_path, capsys):
    from ops.__main__ import main as cli_main

    n = len(_dense(_load(tiny_folder)))
    assert cli_main(["rewrite", str(tiny_folder / "model.onnx"), str(tmp_path / "a.onnx"), "--only", "float-matmul"]) == 0
    assert (f"rewrote {n} of {n} MatMul nodes into ort_mtp MatMul ({n // 2} pairs reading one input merged into "
            "two-weight nodes)") in capsys.readouterr().out
    model = onnx.load(str(tmp_path / "a.onnx"), load_external_data=False)
    assert not _dense(model) and len(_dense(model, "ort_mtp")) == n // 2
    assert {x.domain for x in model.graph.node if x.op_type == "MatMulNBits"} == {"com.microsoft"}
    activation = fm.model(8, 4, node_name="x")
    activation.graph.node[0].domain = ""
    onnx.save(activation, str(tmp_path / "act.onnx"))
    assert cli_main(["rewrite", str(tmp_path / "act.onnx"), str(tmp_path / "b.onnx"), "--only", "float-matmul"]) == 2
    err = capsys.readouterr().err
    assert "none of its 1 MatMul nodes can be rewritten" in err and "is not a constant weight" in err
