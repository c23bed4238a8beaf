"""ops.rewrite and `python -m ops rewrite` on small synthetic models: which nodes are swapped, that the
weights are shared and never copied, that rewritten models compute what the originals compute, the
genai-folder handling, and the CLI's errors.

The test model is a chain A -> up (4-bit, packed zero points, bias) -> down (8-bit) -> q (2-bit: our
op does not run it, so it stays com.microsoft) -> If(then: 4-bit, else: 4-bit unnamed node) ->
lm_head, with every weight in one external data file.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ops
import ops.rewrite
from ops import nbits
from ops.__main__ import main as cli_main
from ops.rewrite import (
    GENAI_LIBRARY_KEY,
    RewriteError,
    external_data_files,
    genai_model_sections,
    rewrite_file,
    rewrite_folder,
    rewrite_model,
    rewrite_model_report,
)
from ops.staging import OutputError

U32 = 2.0**-24
NAMES = {
    "up": "/model/layers.0/mlp/up_proj/MatMul_Q4",
    "down": "/model/layers.0/mlp/down_proj/MatMul_Q8",
    "q2": "/model/layers.1/attn/q_proj/MatMul_Q2",
    "then": "/model/layers.1/then/MatMul_Q4",
    "lm_head": "/lm_head/MatMul_Q4",
}
ELSE_OUTPUT = "else_out"  # the else branch's node has no name: it is matched by its output


def _matmul(w, a, y, name, prefix):
    inits = [nbits.tensor(f"{prefix}.B", w.b), nbits.tensor(f"{prefix}.scales", w.scales, "float32")]
    inputs = [a, f"{prefix}.B", f"{prefix}.scales"]
    if w.zero_points is not None:
        inits.append(nbits.tensor(f"{prefix}.zp", w.zero_points))
        inputs.append(f"{prefix}.zp")
    if w.bias is not None:
        inits.append(nbits.tensor(f"{prefix}.bias", w.bias, "float32"))
        inputs += [""] * (4 - len(inputs)) + ["", f"{prefix}.bias"]
    node = helper.make_node("MatMulNBits", inputs, [y], name=name, domain="com.microsoft",
                            K=w.K, N=w.N, bits=w.bits, block_size=w.block_size, accuracy_level=0)
    return node, inits


def chain_model(seed=0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    layers = {
        "up": nbits.random_weights(rng, 64, 48, bits=4, block_size=32, zero_points="packed", bias=True),
        "down": nbits.random_weights(rng, 48, 40, bits=8, block_size=16),
        "q2": nbits.random_weights(rng, 40, 32, bits=2, block_size=16, scale=0.1),
        "then": nbits.random_weights(rng, 32, 24, bits=4, block_size=16, zero_points="typed"),
        "else": nbits.random_weights(rng, 32, 24, bits=4, block_size=32, bias=True),
        "lm_head": nbits.random_weights(rng, 24, 50, bits=4, block_size=16),
    }
    inits, nodes = [], []
    for key, a, y in [("up", "A", "h0"), ("down", "h0", "h1"), ("q2", "h1", "h2")]:
        node, tensors = _matmul(layers[key], a, y, NAMES[key], key)
        nodes.append(node)
        inits += tensors
    then_node, tensors = _matmul(layers["then"], "h2", "then_out", NAMES["then"], "then")
    inits += tensors
    else_node, tensors = _matmul(layers["else"], "h2", ELSE_OUTPUT, "", "else")
    inits += tensors
    out_info = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, None)  # noqa: E731
    then_graph = helper.make_graph([then_node], "then", [], [out_info("then_out")])
    else_graph = helper.make_graph([else_node], "else", [], [out_info(ELSE_OUTPUT)])
    nodes.append(helper.make_node("If", ["cond"], ["h3"], name="branch", then_branch=then_graph, else_branch=else_graph))
    node, tensors = _matmul(layers["lm_head"], "h3", "logits", NAMES["lm_head"], "lm_head")
    nodes.append(node)
    inits += tensors
    graph = helper.make_graph(
        nodes, "chain",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", 64]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["M", 50])],
        initializer=inits,
    )
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                  helper.make_opsetid("com.microsoft", 1)])


def save_with_external_data(model, path: Path, location: str) -> None:
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=0)


@pytest.fixture
def model_dir(tmp_path) -> Path:
    folder = tmp_path / "src"
    folder.mkdir()
    save_with_external_data(chain_model(), folder / "model.onnx", "model.onnx.data")
    return folder


def _outputs(cpu_session, model_path, a, cond):
    return cpu_session(model_path).run(None, {"A": a, "cond": np.array(cond)})[0]


def _assert_same_outputs(cpu_session, original, rewritten):
    """The rewritten chain computes what the original computes, down both If branches. Each of the
    five float32 matmuls agrees with ORT's within (K + 8) u32 of its magnitude (test_matmul_nbits);
    relative to the output scale that is < 2e-5 per layer for K <= 64, so 1e-4 covers the chain."""
    a = nbits.round_to(np.random.default_rng(1).standard_normal((5, 64)), "float32")
    for cond in (True, False):
        want = _outputs(cpu_session, original, a, cond)
        got = _outputs(cpu_session, rewritten, a, cond)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def _domains(model) -> dict[str, str]:
    """node name (or output for unnamed nodes) -> domain of every MatMulNBits, subgraphs included."""
    found = {}

    def walk(graph):
        for node in graph.node:
            if node.op_type == "MatMulNBits":
                found[node.name or node.output[0]] = node.domain
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g)

    walk(model.graph)
    return found


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------------------
# rewrite_model


def test_rewrite_model_swaps_supported_nodes_in_place():
    model = chain_model()
    initializers_before = [t.SerializeToString() for t in model.graph.initializer]
    report = rewrite_model_report(model)
    assert report.count == 5
    assert report.unsupported == [(NAMES["q2"], "bits=2 is not supported (4 or 8)")]
    domains = _domains(model)
    assert domains.pop(NAMES["q2"]) == "com.microsoft"
    assert set(domains.values()) == {"ort_mtp"} and ELSE_OUTPUT in domains and NAMES["then"] in domains
    assert any(o.domain == "ort_mtp" and o.version == 1 for o in model.opset_import)
    assert [t.SerializeToString() for t in model.graph.initializer] == initializers_before
    onnx.checker.check_model(model)


@pytest.mark.parametrize(
    "include,exclude,expected",
    [
        (None, "/lm_head/*", {"up", "down", "then", "else"}),
        ("/model/layers.0/*", None, {"up", "down"}),
        ("re:mlp/(up|down)", "*down*", {"up"}),
        (["*then*", ELSE_OUTPUT], None, {"then", "else"}),
        ("re:^/lm_head", None, {"lm_head"}),
    ],
)
def test_include_and_exclude(include, exclude, expected):
    model = chain_model()
    count = rewrite_model(model, include=include, exclude=exclude)
    names = {**NAMES, "else": ELSE_OUTPUT}
    swapped = {key for key, name in names.items() if _domains(model)[name] == "ort_mtp"}
    assert count == len(expected) and swapped == expected


def test_nothing_selected_leaves_the_model_alone():
    model = chain_model()
    before = model.SerializeToString()
    assert rewrite_model(model, include="no such node") == 0
    assert model.SerializeToString() == before  # no opset import added either


def test_bad_regex_is_a_clear_error():
    with pytest.raises(RewriteError, match=r"include pattern 're:\(' is not a valid regular expression"):
        rewrite_model(chain_model(), include="re:(")


@pytest.mark.parametrize(
    "mutate,reason",
    [
        (lambda n: n.input.__setitem__(4, "g_idx"), "g_idx (act-order) is not supported"),  # up has 6 inputs
        (lambda n: n.attribute.append(helper.make_attribute("weight_prepacked", 2)), "attribute 'weight_prepacked'"),
        (lambda n: [n.attribute.remove(a) for a in list(n.attribute) if a.name == "block_size"]
         + [n.attribute.append(helper.make_attribute("block_size", 512))], "block_size=512"),
    ],
)
def test_unsupported_nodes_are_kept_with_a_reason(mutate, reason):
    model = chain_model()
    node = next(n for n in model.graph.node if n.name == NAMES["up"])
    mutate(node)
    report = rewrite_model_report(model)
    node = next(n for n in model.graph.node if n.name == NAMES["up"])  # the rewritten proto's node
    assert node.domain == "com.microsoft"
    assert any(name == NAMES["up"] and reason in why for name, why in report.unsupported)


def test_prepacked_zero_means_raw_layout():
    model = chain_model()
    node = next(n for n in model.graph.node if n.name == NAMES["up"])
    node.attribute.append(helper.make_attribute("weight_prepacked", 0))
    rewrite_model(model)
    node = next(n for n in model.graph.node if n.name == NAMES["up"])  # the rewritten proto's node
    assert node.domain == "ort_mtp"


def test_in_memory_rewrite_runs_on_the_original_external_data(model_dir, cpu_session, library_path):
    """How a driver uses rewrite_model without writing a file: the session reads the weights from the
    source folder through ORT's external-initializers folder option."""
    model = onnx.load(str(model_dir / "model.onnx"), load_external_data=False)
    assert rewrite_model(model) == 5
    options = ort.SessionOptions()
    options.register_custom_ops_library(library_path)
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(model_dir))
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    a = nbits.round_to(np.random.default_rng(2).standard_normal((2, 64)), "float32")
    want = _outputs(cpu_session, model_dir / "model.onnx", a, True)
    got = session.run(None, {"A": a, "cond": np.array(True)})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


# ------------------------------------------------------------------------------------------------
# rewrite_file


def test_file_in_the_same_folder_shares_external_data(model_dir, cpu_session):
    data = model_dir / "model.onnx.data"
    size, digest = data.stat().st_size, _digest(data)
    report = rewrite_file(model_dir / "model.onnx", model_dir / "model_ort_mtp.onnx")
    assert report.model.count == 5 and report.data_files == {"model.onnx.data": "shared"}
    assert sorted(p.name for p in model_dir.iterdir()) == ["model.onnx", "model.onnx.data", "model_ort_mtp.onnx"]
    assert data.stat().st_size == size and _digest(data) == digest
    rewritten = onnx.load(str(model_dir / "model_ort_mtp.onnx"), load_external_data=False)
    assert external_data_files(rewritten) == ["model.onnx.data"]
    assert all(t.data_location == TensorProto.EXTERNAL for t in rewritten.graph.initializer)
    # the graph file does not grow by the weights (a few bytes for the domain names and opset)
    assert (model_dir / "model_ort_mtp.onnx").stat().st_size < (model_dir / "model.onnx").stat().st_size + 200
    _assert_same_outputs(cpu_session, model_dir / "model.onnx", model_dir / "model_ort_mtp.onnx")


def test_file_in_another_folder_hard_links_external_data(model_dir, tmp_path, cpu_session):
    out = tmp_path / "out"
    out.mkdir()
    report = rewrite_file(model_dir / "model.onnx", out / "m.onnx", exclude="/lm_head/*")
    assert report.model.count == 4 and report.data_files == {"model.onnx.data": "link"}
    src_data, dst_data = model_dir / "model.onnx.data", out / "model.onnx.data"
    assert dst_data.samefile(src_data) and src_data.stat().st_nlink == 2  # one copy of the bytes on disk
    _assert_same_outputs(cpu_session, model_dir / "model.onnx", out / "m.onnx")


def test_file_into_empty_folder_keeps_its_name(model_dir, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    report = rewrite_file(model_dir / "model.onnx", out)
    assert report.output == out / "model.onnx" and report.output.is_file()


def test_file_with_embedded_weights(tmp_path, cpu_session):
    onnx.save_model(chain_model(), str(tmp_path / "inline.onnx"))
    report = rewrite_file(tmp_path / "inline.onnx", tmp_path / "inline_ort_mtp.onnx")
    assert report.model.count == 5 and report.data_files == {}
    _assert_same_outputs(cpu_session, tmp_path / "inline.onnx", tmp_path / "inline_ort_mtp.onnx")


@pytest.mark.parametrize(
    "case,message",
    [
        ("output exists", "already exists"),
        ("output folder not empty", "exists and is not empty"),
        ("missing data", "external data file"),
        ("clashing data", "exists and is not"),
        ("not a model", "is not an ONNX model"),
        ("damaged name", "is not UTF-8 text"),
        ("missing input", "no such model file"),
    ],
)
def test_file_errors(case, message, model_dir, tmp_path):
    source, output = model_dir / "model.onnx", tmp_path / "out.onnx"
    if case == "output exists":
        output.write_bytes(b"x")
    elif case == "output folder not empty":
        output = tmp_path / "full"
        output.mkdir()
        (output / "f").write_text("x")
    elif case == "missing data":
        (model_dir / "model.onnx.data").unlink()
    elif case == "clashing data":
        (tmp_path / "model.onnx.data").write_bytes(b"other bytes")
    elif case == "not a model":
        source = model_dir / "notes.onnx"
        source.write_text("not a protobuf {")
    elif case == "damaged name":  # one byte of a node name that is not UTF-8 (found by a byte fuzz)
        data = bytearray(source.read_bytes())
        name = next(n.name for n in onnx.load(str(source), load_external_data=False).graph.node if n.name)
        data[data.index(name.encode())] = 0xFF
        source = model_dir / "damaged.onnx"
        source.write_bytes(bytes(data))
    elif case == "missing input":
        source = model_dir / "absent.onnx"
    with pytest.raises(RewriteError, match=message):
        rewrite_file(source, output)
    if case in ("missing data", "clashing data", "not a model", "damaged name"):
        assert not output.exists()  # nothing written on failure


# ------------------------------------------------------------------------------------------------
# rewrite_folder (genai-format folders)


@pytest.fixture
def genai_folder(tmp_path) -> Path:
    """A folder shaped like onnxruntime-genai's: the decoder and an MTP head that share one external
    data file (as the builder's shared_initializers do), an embedding model whose section has no
    session_options (genai falls back to the decoder's), a tokenizer and a nested file."""
    folder = tmp_path / "genai"
    folder.mkdir()
    decoder, head = chain_model(0), chain_model(1)
    save_with_external_data(decoder, folder / "model.onnx", "weights.data")
    # The head reuses the decoder's data file at the same offsets: write its graph with the
    # decoder's external references (same initializer names), so no second copy of bytes exists.
    decoder_refs = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    head.graph.ClearField("initializer")
    head.graph.initializer.extend(decoder_refs.graph.initializer)
    (folder / "mtp.onnx").write_bytes(head.SerializeToString())
    (folder / "embeddings.onnx").write_bytes(decoder_refs.SerializeToString())
    config = {
        "model": {
            "decoder": {"filename": "model.onnx", "session_options": {"log_id": "onnxruntime-genai",
                                                                      "provider_options": []}},
            "mtp": {"filename": "mtp.onnx", "session_options": {"provider_options": []}},
            "embedding": {"filename": "embeddings.onnx"},
            "type": "qwen3",
        },
        "search": {"max_length": 16},
    }
    (folder / "genai_config.json").write_text(json.dumps(config, indent=4))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "extra").mkdir()
    (folder / "extra" / "notes.txt").write_text("carried over")
    return folder


def test_folder_rewrite(genai_folder, tmp_path, cpu_session, library_path):
    before = {p.relative_to(genai_folder): _digest(p) for p in genai_folder.rglob("*") if p.is_file()}
    out = tmp_path / "out"
    report = rewrite_folder(genai_folder, out)
    assert {name: r.count for name, r in report.models.items()} == {"model.onnx": 5, "mtp.onnx": 5,
                                                                    "embeddings.onnx": 5}
    # the source folder is untouched (the output shares its files by hard link)
    assert before == {p.relative_to(genai_folder): _digest(p) for p in genai_folder.rglob("*") if p.is_file()}
    # weights and everything else are hard links, not copies
    for rel in ["weights.data", "tokenizer.json", "extra/notes.txt"]:
        assert (out / rel).samefile(genai_folder / rel), rel
    assert report.copies == 0 and report.links == 3
    # the library sits in the folder and each rewritten model's session options name it
    assert report.library == Path(library_path).name
    assert _digest(out / report.library) == _digest(Path(library_path))
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["decoder"]["session_options"][GENAI_LIBRARY_KEY] == report.library
    assert config["model"]["mtp"]["session_options"][GENAI_LIBRARY_KEY] == report.library
    assert "session_options" not in config["model"]["embedding"]  # covered by the decoder's
    assert config["model"]["decoder"]["session_options"]["log_id"] == "onnxruntime-genai"
    for name in report.models:
        _assert_same_outputs(cpu_session, genai_folder / name, out / name)


def test_folder_rewrite_with_filter_leaves_unselected_models_linked(genai_folder, tmp_path):
    out = tmp_path / "out"
    report = rewrite_folder(genai_folder, out, include="re:lm_head")
    assert all(r.count == 1 for r in report.models.values())
    report = rewrite_folder(genai_folder, tmp_path / "out2", include="no such node")
    assert report.count == 0 and report.library is None
    assert (tmp_path / "out2" / "model.onnx").samefile(genai_folder / "model.onnx")
    config = json.loads((tmp_path / "out2" / "genai_config.json").read_text())
    assert GENAI_LIBRARY_KEY not in config["model"]["decoder"]["session_options"]


def test_genai_model_sections_finds_nested_models():
    config = {"model": {"decoder": {"filename": "a.onnx", "pipeline": [{"stage": {"filename": "b.onnx"}}]},
                        "vision": {"filename": "c.onnx"}, "speech": {"config_filename": "x.json"}}}
    assert [path for path, _ in genai_model_sections(config)] == [
        "model.decoder", "model.decoder.pipeline[0].stage", "model.vision"]


@pytest.mark.parametrize(
    "case,message",
    [
        ("no config", "not an onnxruntime-genai model folder"),
        ("bad json", "is not valid JSON"),
        ("no models", "names no .onnx model"),
        ("missing model", "no such model file"),
        ("escaping model", "is not a path inside its folder"),
        ("other library", "already loads custom-op library 'libother.so'"),
        ("output not empty", "exists and is not an empty folder"),
    ],
)
def test_folder_errors(case, message, genai_folder, tmp_path):
    config_path = genai_folder / "genai_config.json"
    config = json.loads(config_path.read_text())
    output = tmp_path / "out"
    if case == "no config":
        config_path.unlink()
    elif case == "bad json":
        config_path.write_text("{ not json")
    elif case == "no models":
        config_path.write_text(json.dumps({"model": {"type": "x"}}))
    elif case == "missing model":
        config["model"]["mtp"]["filename"] = "absent.onnx"
    elif case == "escaping model":
        config["model"]["mtp"]["filename"] = "../model.onnx"
    elif case == "other library":
        config["model"]["mtp"]["session_options"][GENAI_LIBRARY_KEY] = "libother.so"
    elif case == "output not empty":
        output.mkdir()
        (output / "x").write_text("x")
    if case in ("missing model", "escaping model", "other library"):
        config_path.write_text(json.dumps(config))
    with pytest.raises(RewriteError, match=message):
        rewrite_folder(genai_folder, output)
    if case != "output not empty":
        assert not output.exists() or not any(output.iterdir())  # nothing written on failure


@pytest.mark.parametrize("output", ["SOURCE", "SOURCE/sub", "SOURCE/sub/deeper"])
def test_folder_output_is_never_the_source_folder_or_inside_it(genai_folder, output):
    before = _tree(genai_folder)
    with pytest.raises(OutputError, match="source folder"):
        rewrite_folder(genai_folder, Path(output.replace("SOURCE", str(genai_folder))))
    assert _tree(genai_folder) == before


def _tree(folder: Path) -> dict[str, str]:
    """Every entry below folder (hidden ones too) -> its content's digest ("dir" for folders)."""
    return {p.relative_to(folder).as_posix(): "dir" if p.is_dir() else _digest(p) for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_a_dangling_symlink_output_into_the_source_is_refused(kind, model_dir, genai_folder, tmp_path, capsys):
    """OUT is a link to a path that does not exist yet, inside the source folder: nothing may be
    written through it (the file rewrite used to put its model into the source folder)."""
    source = genai_folder if kind == "folder" else model_dir / "model.onnx"
    source_folder = genai_folder if kind == "folder" else model_dir
    before = _tree(source_folder)
    link = tmp_path / ("out" if kind == "folder" else "out.onnx")
    link.symlink_to(source_folder / ("new_folder" if kind == "folder" else "new.onnx"))
    assert cli_main(["rewrite", str(source), str(link)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "is a symbolic link" in err
    assert _tree(source_folder) == before
    assert link.is_symlink() and not link.exists()


@pytest.mark.parametrize("error", [OSError, KeyboardInterrupt])
def test_a_failed_file_rewrite_leaves_nothing_and_a_rerun_works(model_dir, tmp_path, monkeypatch, error):
    """Failing as the model is saved, after its data file was linked: no model, no data file, no
    staging folder is left next to the output."""
    out = tmp_path / "out"
    out.mkdir()
    real_save = ops.rewrite.save_model

    def fail(model, path):
        path.write_bytes(b"half a model")
        raise error("simulated failure while saving")

    monkeypatch.setattr(ops.rewrite, "save_model", fail)
    with pytest.raises(error, match="simulated"):
        rewrite_file(model_dir / "model.onnx", out / "m.onnx")
    assert _tree(out) == {}
    monkeypatch.setattr(ops.rewrite, "save_model", real_save)
    report = rewrite_file(model_dir / "model.onnx", out / "m.onnx")
    assert report.data_files == {"model.onnx.data": "link"} and sorted(_tree(out)) == ["m.onnx", "model.onnx.data"]


@pytest.mark.parametrize("error", [OSError, KeyboardInterrupt])
def test_a_failed_folder_rewrite_leaves_no_folder_and_a_rerun_works(genai_folder, tmp_path, monkeypatch, error):
    out = tmp_path / "out"
    real_save = ops.rewrite.save_model
    saved = []

    def fail_on_the_second(model, path):
        saved.append(path.name)
        if len(saved) == 2:
            raise error("simulated failure while saving")
        real_save(model, path)

    monkeypatch.setattr(ops.rewrite, "save_model", fail_on_the_second)
    with pytest.raises(error, match="simulated"):
        rewrite_folder(genai_folder, out)
    assert not out.exists() and os.listdir(tmp_path) == ["genai"]
    monkeypatch.setattr(ops.rewrite, "save_model", real_save)
    assert rewrite_folder(genai_folder, out).count == 15


# ------------------------------------------------------------------------------------------------
# CLI


def test_cli_library_path(capsys):
    assert cli_main(["library-path"]) == 0
    assert capsys.readouterr().out.strip() == ops.library_path()


def test_cli_rewrite_file_and_folder(model_dir, genai_folder, tmp_path, capsys):
    assert cli_main(["rewrite", str(model_dir / "model.onnx"), str(tmp_path / "cli.onnx"),
                     "--exclude", "/lm_head/*", "--include", "re:.", "--exclude", "never"]) == 0
    captured = capsys.readouterr()
    assert "model.onnx: rewrote 4 of 6 MatMulNBits nodes" in captured.out
    assert f"kept '{NAMES['q2']}' as com.microsoft MatMulNBits: bits=2 is not supported" in captured.err
    assert "pattern 'never' matched no MatMulNBits node" in captured.err
    assert cli_main(["rewrite", str(genai_folder), str(tmp_path / "cli_folder")]) == 0
    assert "library libort_mtp_ops.so copied in" in capsys.readouterr().out
    assert (tmp_path / "cli_folder" / "genai_config.json").is_file()


@pytest.mark.parametrize(
    "args,message",
    [
        (["IN_MISSING", "OUT"], "no such file or folder"),
        (["IN_FILE", "OUT_EXISTS"], "already exists"),
        (["IN_FOLDER", "OUT_FULL"], "exists and is not an empty folder"),
        (["IN_TEXT", "OUT"], "is not an ONNX model"),
        (["IN_PLAIN_FOLDER", "OUT"], "is not an onnxruntime-genai model folder"),
        (["IN_FILE", "OUT", "--include", "re:["], "is not a valid regular expression"),
        (["IN_FILE", "OUT", "--include", "nothing*"], "select none of its 6 MatMulNBits nodes"),
        (["IN_FOLDER", "OUT", "--library", "NO_LIB"], "does not exist"),
        (["IN_FOLDER", "OUT", "--library", "IN_TEXT"], "is not a usable custom-op library"),  # not copied in
        (["IN_FOLDER", "OUT", "--library", "IN_PLAIN_FOLDER"], "is not a file"),
    ],
)
def test_cli_errors_are_one_line(args, message, model_dir, genai_folder, tmp_path, capsys):
    (tmp_path / "exists.onnx").write_bytes(b"x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (tmp_path / "text.onnx").write_text("hello")
    (tmp_path / "plain").mkdir()
    paths = {"IN_MISSING": tmp_path / "missing.onnx", "IN_FILE": model_dir / "model.onnx",
             "IN_FOLDER": genai_folder, "IN_TEXT": tmp_path / "text.onnx", "IN_PLAIN_FOLDER": tmp_path / "plain",
             "OUT": tmp_path / "new_out", "OUT_EXISTS": tmp_path / "exists.onnx", "OUT_FULL": tmp_path / "full",
             "NO_LIB": tmp_path / "libnothing.so"}
    assert cli_main([str(paths.get(a, a)) for a in ["rewrite", *args]]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("error: ") and message in captured.err
    assert not (tmp_path / "new_out").exists()


def test_cli_in_a_subprocess(model_dir, tmp_path):
    """The real entry point: exit status, one line on error, no traceback; usage errors exit 2."""
    run = lambda *a: subprocess.run([sys.executable, "-m", "ops", *a], capture_output=True, text=True)  # noqa: E731
    bad = run("rewrite", str(tmp_path / "missing"), str(tmp_path / "o"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    good = run("rewrite", str(model_dir / "model.onnx"), str(tmp_path / "o.onnx"))
    assert good.returncode == 0, good.stderr
    assert "rewrote 5 of 6" in good.stdout
    usage = run("rewrite")
    assert usage.returncode == 2 and "usage:" in usage.stderr and "Traceback" not in usage.stderr
