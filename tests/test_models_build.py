"""The synthetic model folders: they load and generate in onnxruntime-genai, compute what an
independent numpy forward of the same weights computes, and are reproducible."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from genai_helpers import genai_greedy
from models.build import FOLDER_FILES, build
from models.config import BuildOptions, Synthesis, preset
from models.reference import Reference, load_initializers
from models.weights import dequantize

TINY = preset("tiny")
PROMPT = [300, 4021, 77, 1290, 5000, 12, 813, 2600]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """tiny at the precisions/EPs the tests run on the CPU EP (fp16 graphs run there too)."""
    made = {}
    for precision, ep in (("int4", "cpu"), ("fp32", "cpu"), ("int4", "cuda"), ("fp16", "cuda")):
        out = tmp_path_factory.mktemp(f"tiny_{precision}_{ep}")
        build(TINY, out, BuildOptions(precision=precision, ep=ep))
        made[precision, ep] = out
    return made


def _full_sequence(folder, tokens):
    """One ORT CPU forward of model.onnx over the whole sequence with empty caches."""
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    n = len(tokens)
    feeds = {}
    for info in session.get_inputs():
        if info.name == "input_ids":
            feeds[info.name] = np.array([tokens], np.int64)
        elif info.name == "attention_mask":
            feeds[info.name] = np.ones((1, n), np.int64)
        elif info.name == "position_ids":
            feeds[info.name] = np.tile(np.arange(n, dtype=np.int64), (3, 1, 1))
        else:
            dims = [{"batch_size": 1, "past_sequence_length": 0, "kv_cache_dim": TINY.head_dim}.get(d, d) for d in info.shape]
            feeds[info.name] = np.zeros(dims, np.float16 if "float16" in info.type else np.float32)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


def test_folder_has_every_file_and_mtp_section(folders):
    for folder in folders.values():
        assert sorted(p.name for p in folder.iterdir()) == sorted(FOLDER_FILES)
        config = json.loads((folder / "genai_config.json").read_text())
        assert config["model"]["type"] == "qwen3_5_text"
        assert config["model"]["mtp"]["filename"] == "mtp.onnx"
        assert config["model"]["decoder"]["outputs"]["hidden_states"] == "hidden_states"


def test_cpu_folders_omit_shared_initializers_and_cuda_folders_list_them(folders):
    """genai 0.18 on CPU refuses shared_initializers; the CUDA config mirrors the builder's."""
    cpu = json.loads((folders["int4", "cpu"] / "genai_config.json").read_text())["model"]
    cuda = json.loads((folders["int4", "cuda"] / "genai_config.json").read_text())["model"]
    assert "shared_initializers" not in cpu["decoder"] and "shared_initializers" not in cpu["mtp"]
    names = [s["name"] for s in cuda["decoder"]["shared_initializers"]]
    assert names == ["model.embed_tokens.weight", "lm_head.MatMul.weight_Q4", "lm_head.MatMul.weight_scales"]
    # every entry points at the bytes the main graph's initializer points at
    main = onnx.load(folders["int4", "cuda"] / "model.onnx", load_external_data=False)
    for entry in cuda["decoder"]["shared_initializers"]:
        tensor = next(t for t in main.graph.initializer if t.name == entry["name"])
        ext = {e.key: e.value for e in tensor.external_data}
        assert (ext["location"], ext["offset"], ext["length"]) == (entry["data_file"], entry["offset"], entry["length"])


def test_tiny_loads_and_generates_in_genai(folders):
    og = pytest.importorskip("onnxruntime_genai")
    model = og.Model(str(folders["int4", "cpu"]))
    tokenizer = og.Tokenizer(model)
    prompt = [int(t) for t in tokenizer.encode("def greet(name):\n    return")]
    new = genai_greedy(model, prompt, 24)
    assert len(new) == 24
    assert all(0 <= t < TINY.vocab_size - 3 for t in new), "special tokens must never win the argmax"
    assert isinstance(tokenizer.decode(new), str) and tokenizer.decode(new)


def test_fp16_cpu_folder_is_the_cuda_graph_with_a_cpu_config(tmp_path):
    """For fp16 on CPU the builder switches attention to MultiHeadAttention; we keep the CUDA fp16
    graph (GroupQueryAttention runs on the CPU EP) and change only the genai_config for CPU."""
    cpu, cuda = tmp_path / "cpu", tmp_path / "cuda"
    build(TINY, cpu, BuildOptions(precision="fp16", ep="cpu"))
    build(TINY, cuda, BuildOptions(precision="fp16", ep="cuda"))
    for name in ("model.onnx", "model.onnx.data", "mtp.onnx", "mtp.onnx.data"):
        assert (cpu / name).read_bytes() == (cuda / name).read_bytes(), name
    a = json.loads((cpu / "genai_config.json").read_text())
    b = json.loads((cuda / "genai_config.json").read_text())
    assert b["model"]["decoder"].pop("shared_initializers") and b["model"]["mtp"].pop("shared_initializers")
    b["model"]["decoder"]["session_options"]["provider_options"] = []
    assert a == b


def test_genai_mtp_generator_runs_our_folder_losslessly(tmp_path):
    """onnxruntime-genai's own MtpGenerator (CPU, fp16 folder, head as a separate folder) accepts
    the format: its output equals plain greedy and most drafts are accepted."""
    og = pytest.importorskip("onnxruntime_genai")
    from models.head_folder import write_head_folder

    folder = tmp_path / "tiny_fp16"
    build(TINY, folder, BuildOptions(precision="fp16", ep="cpu"))
    main, head = og.Model(str(folder)), og.Model(str(write_head_folder(folder, tmp_path / "head")))
    params = og.GeneratorParams(main)
    params.set_search_options(max_length=len(PROMPT) + 48, do_sample=False)
    mtp = og.MtpGenerator(main, head, params)
    mtp.append_tokens(np.asarray(PROMPT, np.int32))
    while not mtp.is_done():
        mtp.generate_next_token()
    assert [int(t) for t in mtp.get_sequence()] == list(PROMPT) + genai_greedy(main, PROMPT, 48)
    stats = mtp.get_stats()
    assert stats["trials"] > 0 and stats["acceptance_rate"] > 0.5


def test_genai_greedy_tokens_equal_numpy_reference(folders):
    """fp32: onnxruntime-genai's cached greedy decode vs a cache-free float64 forward per token."""
    og = pytest.importorskip("onnxruntime_genai")
    folder = folders["fp32", "cpu"]
    model = og.Model(str(folder))
    new_tokens = 20
    assert genai_greedy(model, PROMPT, new_tokens) == Reference(folder).greedy(PROMPT, new_tokens)


@pytest.mark.parametrize(
    "key, tolerance",
    [(("fp32", "cpu"), 1e-4), (("int4", "cpu"), 0.1), (("int4", "cuda"), 0.05), (("fp16", "cuda"), 0.05)],
)
def test_ort_forward_matches_reference(folders, key, tolerance):
    """Target logits/hidden and the MTP head's outputs, ORT vs numpy, at every precision.
    (CPU int4 quantizes activations to int8 -- accuracy_level 4 -- hence its looser bound.)"""
    folder = folders[key]
    tokens = PROMPT + [5, 6, 7, 8100]
    out = _full_sequence(folder, tokens)
    reference = Reference(folder)
    logits, hidden = reference.forward(tokens)
    assert np.abs(out["logits"][0].astype(np.float64) - logits).max() < tolerance
    assert np.abs(out["hidden_states"][0].astype(np.float64) - hidden).max() < tolerance
    assert (out["logits"][0].argmax(-1) == logits.argmax(-1)).mean() >= 0.9

    head = ort.InferenceSession(str(folder / "mtp.onnx"), providers=["CPUExecutionProvider"])
    io = out["hidden_states"].dtype
    pairs = len(tokens) - 1
    feeds = {
        "input_ids": np.array([tokens[1:]], np.int64),
        "attention_mask": np.ones((1, pairs), np.int64),
        "position_ids": np.tile(np.arange(pairs, dtype=np.int64), (3, 1, 1)),
        "past_key_values.0.key": np.zeros((1, TINY.num_key_value_heads, 0, TINY.head_dim), io),
        "past_key_values.0.value": np.zeros((1, TINY.num_key_value_heads, 0, TINY.head_dim), io),
        "hidden_states": out["hidden_states"][:, :-1],
    }
    head_out = dict(zip([o.name for o in head.get_outputs()], head.run(None, feeds)))
    ref_logits, ref_hidden = reference.mtp(tokens[1:], out["hidden_states"][0, :-1])
    assert np.abs(head_out["logits"][0] - ref_logits).max() < tolerance
    assert np.abs(head_out["hidden_states_out"][0] - ref_hidden).max() < tolerance


def test_every_precision_stores_the_same_weights(folders):
    """int4 blocks are the definition: fp32/fp16 builds hold their exact dequantization."""
    q = load_initializers(folders["int4", "cpu"] / "model.onnx")
    f32 = load_initializers(folders["fp32", "cpu"] / "model.onnx")
    f16 = load_initializers(folders["fp16", "cuda"] / "model.onnx")
    for base in ("model.layers.0.linear_attn.qkv_proj", "model.layers.3.attn.o_proj", "lm_head"):
        dense = dequantize(q[f"{base}.MatMul.weight_Q4"], q[f"{base}.MatMul.weight_scales"])
        np.testing.assert_array_equal(dense.T, f32[f"{base}.MatMul.weight"])
        np.testing.assert_array_equal(dense.T.astype(np.float16), f16[f"{base}.MatMul.weight"])
    np.testing.assert_array_equal(q["model.embed_tokens.weight"].astype(np.float16), f16["model.embed_tokens.weight"])


def test_predictive_construction(folders):
    """Out-projections small, MTP fc = [identity | small noise], special tokens' lm_head rows zero."""
    w = load_initializers(folders["fp32", "cpu"] / "model.onnx")
    head = load_initializers(folders["fp32", "cpu"] / "mtp.onnx")
    hidden = TINY.hidden_size
    fc = head["model.mtp.fc.MatMul.weight"].T  # [H, 2H]
    np.testing.assert_allclose(fc[:, :hidden], np.eye(hidden), atol=1e-3)
    noise = fc[:, hidden:].std() * np.sqrt(hidden)
    assert 0.07 < noise < 0.13  # default mtp_noise 0.1
    down = w["model.layers.0.mlp.down_proj.MatMul.weight"]
    assert 0.01 < down.std() * np.sqrt(TINY.intermediate_size) < 0.03  # out_scale 0.02
    lm_head = w["lm_head.MatMul.weight"]  # [H, V]
    assert not lm_head[:, -3:].any() and lm_head[:, :-3].std() > 0


def test_build_is_deterministic_and_seeded(tmp_path):
    def digest(folder):
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}

    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    build(TINY, a, BuildOptions())
    build(TINY, b, BuildOptions(), threads=1)
    build(TINY, c, BuildOptions(synthesis=Synthesis(seed=1)))
    assert digest(a) == digest(b)
    assert digest(a)["model.onnx.data"] != digest(c)["model.onnx.data"]
    assert digest(a)["model.onnx"] == digest(c)["model.onnx"]


def test_overwrite_with_other_options_replaces_every_file(tmp_path):
    """An int4 build overwritten by an fp32 one is byte for byte a fresh fp32 build, the result
    names the folder (not the staging folder it was written in), and nothing else is left."""
    def digest(folder):
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}

    out, fresh = tmp_path / "out", tmp_path / "fresh"
    build(TINY, out, BuildOptions(precision="int4"), threads=1)
    result = build(TINY, out, BuildOptions(precision="fp32"), overwrite=True, threads=1)
    build(TINY, fresh, BuildOptions(precision="fp32"), threads=1)
    assert digest(out) == digest(fresh)
    assert result.folder == str(out) and result.files == {p.name: p.stat().st_size for p in out.iterdir()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "out"]


def test_state_window_widens_conv_and_recurrent_states(tmp_path):
    build(TINY, tmp_path, BuildOptions(precision="int4", ep="cuda", state_window=4))
    model = onnx.load(tmp_path / "model.onnx", load_external_data=False)
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input}
    assert dims["past.0.conv"] == [4, "batch_size", TINY.linear_conv_dim, TINY.linear_conv_kernel_dim - 1]
    assert dims["past.0.recurrent"] == [4, "batch_size", TINY.linear_num_value_heads, TINY.linear_key_head_dim, TINY.linear_value_head_dim]
    windows = {a.i for n in model.graph.node if n.op_type in ("CausalConvWithState", "LinearAttention") for a in n.attribute if a.name == "state_window"}
    assert windows == {4}


def test_fp16_values_are_finite_through_every_layer(folders):
    """Every intermediate value of the fp16 graph, exposed as an output, is finite."""
    folder = folders["fp16", "cuda"]
    model = onnx.load(folder / "model.onnx")
    known = {o.name for o in model.graph.output}
    for value in model.graph.value_info:
        if value.name not in known and not value.name.startswith("/model/constants") and value.name.startswith("/model/"):
            model.graph.output.append(value)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    tokens = PROMPT * 4
    n = len(tokens)
    feeds = {"input_ids": np.array([tokens], np.int64), "attention_mask": np.ones((1, n), np.int64),
             "position_ids": np.tile(np.arange(n, dtype=np.int64), (3, 1, 1))}
    for info in session.get_inputs():
        if info.name not in feeds:
            dims = [{"batch_size": 1, "past_sequence_length": 0, "kv_cache_dim": TINY.head_dim}.get(d, d) for d in info.shape]
            feeds[info.name] = np.zeros(dims, np.float16)
    outputs = session.run(None, feeds)
    floats = [o for o in outputs if o.dtype in (np.float16, np.float32)]
    assert len(floats) > 100
    assert all(np.isfinite(o).all() for o in floats)


def test_fp16_initializers_are_finite(folders):
    for name, value in load_initializers(folders["fp16", "cuda"] / "model.onnx").items():
        if value.dtype.kind == "f":
            assert np.isfinite(value).all(), name


def test_initializers_hold_declared_bytes(folders):
    """External-data references are in bounds and the data file has no trailing garbage."""
    folder = folders["int4", "cpu"]
    size = (folder / "model.onnx.data").stat().st_size
    end = 0
    for tensor in onnx.load(folder / "model.onnx", load_external_data=False).graph.initializer:
        ext = {e.key: e.value for e in tensor.external_data}
        if ext["location"] != "model.onnx.data":
            continue
        end = max(end, int(ext["offset"]) + int(ext["length"]))
    assert end == size
    arrays = {t.name: numpy_helper.to_array(t) for t in onnx.load(folder / "model.onnx").graph.initializer}
    assert arrays["model.layers.0.linear_attn.qkv_proj.MatMul.weight_Q4"].shape == (
        TINY.linear_conv_dim, TINY.hidden_size // 32, 16)
