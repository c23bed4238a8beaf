"""ort_mtp::SkipSimplifiedLayerNormalization on the CPU EP (csrc/norm/skip_norm.h): against the float64
reference and ONNX Runtime's com.microsoft op, an M-row call bit-identical to M one-row calls at every
thread count, its errors naming the node; and the norm rewrite (ops.norm): our folders' norms move
onto it, what is kept and why.

Tolerance (u_T the unit roundoff: 2^-24 float32, 2^-11 float16, 2^-8 bfloat16): the residual sum is
rounded to T once after float32 adds (u_T + 2 u_32 of |input| + |skip| + |bias|, which the output
carries, once more through the root mean square: 3 u_T in all), the sum of squares of H terms in
order (H u_32, half of it through the square root), the few float32 products after it, and the
output's own rounding (u_T): (4 u_T + (H + 8) u_32) x |the terms| x the exact 1/rms x |gamma|.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ops
import ops.norm as norm
from ops.nbits import UNIT_ROUNDOFF, round_to
from ops.rewrite import NORM, norm_check, rewrite_model_report

NODE = "/model/layers.1/input_layernorm"
LABEL = f"SkipSimplifiedLayerNormalization node '{NODE}'"
U = UNIT_ROUNDOFF
EPS = 1e-6


def _session(model, threads: int = 0, register: bool = True):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    if register:
        options.register_custom_ops_library(ops.library_path())
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _feeds(rng, m: int, hidden: int, dtype: str, scale: float = 1.0):
    io = np.float16 if dtype == "float16" else np.float32
    x = round_to(rng.standard_normal((1, m, hidden)) * scale, dtype).astype(io)
    r = round_to(rng.standard_normal((1, m, hidden)) * scale, dtype).astype(io)
    return {"input": x, "skip": r}


def _bound(feeds, gamma, bias, dtype):
    x, r = (feeds[k].astype(np.float64) for k in ("input", "skip"))
    want, s = norm.reference(x, r, gamma, EPS, bias)
    terms = np.abs(x) + np.abs(r) + (np.abs(bias) if bias is not None else 0)
    inv = 1.0 / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + EPS)
    h = x.shape[-1]
    return want, s, (4 * U[dtype] + (h + 8) * U["float32"]) * terms * inv * np.abs(gamma) + 1e-30, terms


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("hidden,bias", [(64, False), (5120, False), (100, True), (1, False)])
def test_matches_reference_and_rows_do_not_depend_on_m(dtype, hidden, bias):
    rng = np.random.default_rng(hidden)
    gamma = round_to(1 + rng.standard_normal(hidden) / 4, dtype)
    b = round_to(rng.standard_normal(hidden), dtype) if bias else None
    session = _session(norm.model(hidden, dtype, node_name=NODE, gamma=gamma, bias=b, float32_io=dtype == "bfloat16"))
    feeds = _feeds(rng, 6, hidden, dtype)
    y, s = session.run(None, feeds)
    want, want_s, tol, terms = _bound(feeds, gamma, b, dtype)
    assert np.all(np.abs(y.astype(np.float64) - want) <= tol)
    assert np.all(np.abs(s.astype(np.float64) - want_s) <= (U[dtype] + 2 * U["float32"]) * terms + 1e-30)
    for i in range(6):  # each row alone: bit for bit the row of the 6-row call
        one = {k: v[:, i:i + 1] for k, v in feeds.items()}
        y1, s1 = session.run(None, one)
        assert np.array_equal(y1[0, 0], y[0, i]) and np.array_equal(s1[0, 0], s[0, i])


def test_rows_do_not_depend_on_thread_count_and_many_rows_split():
    rng = np.random.default_rng(3)
    model = norm.model(1024, "float16", node_name=NODE)
    feeds = _feeds(rng, 300, 1024, "float16", scale=3.0)  # 300 rows: several tasks of the pool
    outs = [_session(model, threads=t).run(None, feeds) for t in (1, 2, 4)]
    for y, s in outs[1:]:
        assert np.array_equal(y, outs[0][0]) and np.array_equal(s, outs[0][1])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_agrees_with_onnx_runtime_s_op(dtype):
    rng = np.random.default_rng(4)
    gamma = round_to(1 + rng.standard_normal(256) / 4, dtype)
    feeds = _feeds(rng, 5, 256, dtype)
    ours = _session(norm.model(256, dtype, gamma=gamma)).run(None, feeds)
    theirs = _session(norm.model(256, dtype, domain="com.microsoft", gamma=gamma), register=False).run(None, feeds)
    want, _, tol, _ = _bound(feeds, gamma, None, dtype)
    for y in (ours[0], theirs[0]):
        assert np.all(np.abs(y.astype(np.float64) - want) <= 2 * tol)
    assert np.array_equal(ours[1], theirs[1])  # the residual sum: one rounding of the same exact value


def test_without_the_sum_output_and_empty_rows():
    rng = np.random.default_rng(5)
    session = _session(norm.model(32, "float32", outputs=("output",)))
    feeds = _feeds(rng, 3, 32, "float32")
    (y,) = session.run(None, feeds)
    assert np.array_equal(y, _session(norm.model(32, "float32")).run(None, feeds)[0])
    empty = {k: v[:, :0] for k, v in feeds.items()}
    assert session.run(None, empty)[0].shape == (1, 0, 32)


def _refusal(model) -> str:
    with pytest.raises(Exception) as info:
        session = _session(model)
        session.run(None, _feeds(np.random.default_rng(0), 2, 16, "float32"))
    return str(info.value)


@pytest.mark.parametrize("change,message", [
    (lambda m: m.graph.node[0].output.__setitem__(1, "mean"), "outputs mean and inv_std_var are not computed"),
    (lambda m: m.graph.node[0].ClearField("attribute"), "attribute epsilon is required"),
    (lambda m: m.graph.node[0].attribute[0].__setattr__("f", float("nan")), "epsilon"),
    (lambda m: m.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(np.ones(8, np.float32), "gamma")),
     "input gamma has shape [8]"),
    (lambda m: m.graph.input[1].type.tensor_type.shape.dim[2].__setattr__("dim_value", 8), "input skip has shape"),
])
def test_errors_name_the_node(change, message):
    model = norm.model(16, "float32", node_name=NODE)
    change(model)
    if message == "input skip has shape":  # a graph whose skip really is narrower
        feeds = _feeds(np.random.default_rng(0), 2, 16, "float32")
        feeds["skip"] = feeds["skip"][..., :8]
        with pytest.raises(Exception) as info:
            _session(model).run(None, feeds)
        text = str(info.value)
    else:
        text = _refusal(model)
    assert message in text and LABEL in text, text


# ---- the rewrite -----------------------------------------------------------------------------------


def _rewrite(model):
    """The rewrite as on CUDA, structurally (no library check: the CPU EP keeps ORT's kernel)."""
    return rewrite_model_report(model, rewrites=(NORM,))


def test_the_cpu_ep_keeps_onnx_runtime_s_kernel():
    model = norm.model(64, "float16", domain="com.microsoft", node_name=NODE)
    report = rewrite_model_report(model, rewrites=(NORM,), norm=norm_check())
    assert not report.norm.rewritten and report.norm.kept == [
        (NODE, "on the CPU EP ONNX Runtime's kernel is kept (ours is for CUDA's programmatic dependent launch)")]
    assert model.graph.node[0].domain == "com.microsoft"


def test_a_com_microsoft_node_changes_domain_and_computes_what_ours_does():
    model = norm.model(64, "float16", domain="com.microsoft", node_name=NODE)
    report = _rewrite(model)
    assert report.norm.rewritten == [NODE] and not report.norm.kept
    node = model.graph.node[0]
    assert (node.domain, node.op_type, list(node.output)) == ("ort_mtp", "SkipSimplifiedLayerNormalization",
                                                              ["output", "", "", "input_skip_bias_sum"])
    assert any(o.domain == "ort_mtp" for o in model.opset_import)
    feeds = _feeds(np.random.default_rng(6), 4, 64, "float16")
    got = _session(model).run(None, feeds)
    want = _session(norm.model(64, "float16", node_name=NODE)).run(None, feeds)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("kwargs,edit,reason", [
    (dict(epsilon=None), None, "no epsilon attribute"),
    (dict(outputs=("output", "mean", "", "sum")), None, "names output mean (mean)"),
    (dict(), lambda n: n.attribute.append(onnx.helper.make_attribute("simplified", 1)), "attribute 'simplified'"),
    (dict(hidden=norm.MAX_HIDDEN + 16), None, f"above the CUDA kernel's {norm.MAX_HIDDEN}"),
    (dict(dtype="float64"), None, "not float32, float16 or bfloat16"),
])
def test_kept_nodes_say_why(kwargs, edit, reason):
    args = dict(hidden=16, dtype="float32", domain="com.microsoft", node_name=NODE)
    args.update(kwargs)
    model = norm.model(args.pop("hidden"), **args)
    if edit:
        edit(model.graph.node[0])
    report = _rewrite(model)
    assert not report.norm.rewritten and len(report.norm.kept) == 1
    assert report.norm.kept[0][0] == NODE and reason in report.norm.kept[0][1], report.norm.kept


def test_our_folders_norms_move_to_our_op(tiny_folder):
    """Every norm of the tiny preset takes ours (structurally, as on CUDA), none asking for the outputs
    ours does not compute."""
    import onnx

    proto = onnx.load(tiny_folder / "model.onnx", load_external_data=False)
    report = rewrite_model_report(proto, rewrites=(NORM,))
    skip_norms = [n for n in proto.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    assert skip_norms and all(n.domain == "ort_mtp" for n in skip_norms)
    assert len(report.norm.rewritten) == len(skip_norms) and not report.norm.kept
    assert all(list(n.output)[1:3] in ([], ["", ""]) for n in skip_norms)  # no mean / inv_std_var asked for


def test_cli_only_norm_on_the_cpu_says_why(tiny_folder, tmp_path, capsys):
    from ops.__main__ import main

    assert main(["rewrite", str(tiny_folder / "model.onnx"), str(tmp_path / "out.onnx"), "--only", NORM]) != 0
    err = capsys.readouterr().err
    assert "SkipSimplifiedLayerNormalization nodes can be rewritten" in err and "on the CPU EP" in err


def test_a_folder_on_our_norms_runs_and_mtp_prints_greedy_s_tokens(tiny_folder, monkeypatch):
    """The CUDA path's graph on the CPU EP: with the norm rewrite allowed here too, every norm of the
    tiny preset runs on ours inside the whole forward (symbolic shapes, the residual output feeding the
    next layer), and MTP prints greedy's tokens at k = 1..3."""
    from driver import Generator

    from driver.sessions import rewrite_graph

    monkeypatch.setattr(norm, "available", lambda library, provider="cpu", dtype=None, device_id=0: None)
    gen = Generator(tiny_folder, provider="cpu", mode="mtp", draft_tokens=1, max_length=96)
    _, report = rewrite_graph(gen.folder.main, True, gen.device)  # what the generator's session was made from
    assert report.norm.rewritten and not report.norm.kept
    prompt = [5, 17, 300, 42, 7, 99]
    greedy = gen.generate(prompt, 24, mode="greedy", stop_at_eos=False).tokens
    for k in (1, 2, 3):
        assert gen.generate(prompt, 24, draft_tokens=k, stop_at_eos=False).tokens == greedy


@pytest.mark.parametrize("which", ["builder_folder", "builder_windowed_folder"])
def test_onnxruntime_genai_s_builder_norms_take_ours(which, request):
    """The exact graph users bring (onnxruntime-genai's builder, CPU and CUDA exports): every
    SkipSimplifiedLayerNormalization fits the rewrite (as on CUDA), none kept."""
    import onnx

    folder = request.getfixturevalue(which)
    model = onnx.load(folder / "model.onnx", load_external_data=False)
    before = [n.name for n in model.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    assert before
    report = rewrite_model_report(model, rewrites=(NORM,), base_dir=folder)
    assert sorted(report.norm.rewritten) == sorted(before) and not report.norm.kept
