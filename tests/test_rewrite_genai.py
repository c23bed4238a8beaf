"""Real onnxruntime-genai folders: a tiny random Qwen3 checkpoint exported by onnxruntime-genai's own
builder (int4, CPU), and the builder's Qwen3.5 export (conftest's builder folder: linear-attention
layers), rewritten with `ops.rewrite.rewrite_folder`, then loaded and run by onnxruntime-genai itself
on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from ops.rewrite import GENAI_LIBRARY_KEY, rewrite_folder

og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed")


@pytest.fixture(scope="module")
def genai_qwen3(tmp_path_factory) -> Path:
    """Exports a 2-layer, hidden-64 random Qwen3 with the genai builder (about 6 s on 2 cores)."""
    torch = pytest.importorskip("torch", reason="torch is needed to make the tiny Qwen3 checkpoint")
    transformers = pytest.importorskip("transformers", reason="transformers is needed to make the tiny Qwen3 checkpoint")
    root = tmp_path_factory.mktemp("qwen3")
    config = transformers.Qwen3Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).save_pretrained(root / "hf")
    out = root / "genai"
    build = subprocess.run(
        [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(root / "hf"), "-o", str(out),
         "-p", "int4", "-e", "cpu", "-c", str(root / "cache")],
        capture_output=True, text=True, cwd=root)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    return out


def _logits(folder: Path, prompt, next_token) -> list[np.ndarray]:
    """Logits after the prompt, then after one more (fixed) token: a prefill and a decode step."""
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=32)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([prompt], dtype=np.int32))
    first = np.array(generator.get_output("logits"), dtype=np.float32)
    generator.append_tokens(np.array([[next_token]], dtype=np.int32))
    return [first, np.array(generator.get_output("logits"), dtype=np.float32)]


def _exact_arithmetic_copy(source: Path, dest: Path) -> Path:
    """The source folder with every MatMulNBits at accuracy_level 0 (float32 activations in both ORT's
    op and ours). The builder's CPU int4 export sets accuracy_level=4: int8 activations in both."""
    dest.mkdir()
    for path in source.iterdir():
        if path.name != "model.onnx":
            (dest / path.name).hardlink_to(path)
    model = onnx.load(str(source / "model.onnx"), load_external_data=False)
    for node in model.graph.node:
        for attr in node.attribute:
            if node.op_type == "MatMulNBits" and attr.name == "accuracy_level":
                attr.i = 0
    (dest / "model.onnx").write_bytes(model.SerializeToString())
    return dest


# Logits of a rewritten folder against ONNX Runtime's own ops on the source folder, two ways:
# - As built (accuracy_level 4 on every MatMulNBits, kept by the rewrite): both ops quantise A to int8
#   per block with the same scale (max|a| / 127) and integer dot products, and agree per matmul to
#   float32 rounding (tests/test_matmul_nbits_int8.py), except where an activation lies within a few
#   ulps of a rounding boundary: MLAS rounds a * (127 / max|a|), ours a / (max|a| / 127), and a
#   float32-rounding difference upstream (or there) moves such a qa by one step, which shifts outputs
#   by s |w| (s = max|a| / 127) in one term: up to ~1e-3 of a matmul's output scale, less at the
#   logits. Measured on these folders: 2e-7..4e-7 of the largest logit (no flip), where the int8 error
#   itself (ORT at accuracy_level 4 against 0) is 5e-3..1.2e-2: LEVEL4_TOL (2e-3 of the largest logit)
#   leaves room for a flip and still catches a rewrite that loses the int8 path.
# - Exact arithmetic: the source with accuracy_level 0 (our op then runs its float32 kernel), rewritten,
#   against ORT at accuracy_level 0: float32 rounding only, far below 1e-4 of the logit scale.
LEVEL4_TOL = 2e-3


def _check_logits(source: Path, rewritten: Path, tmp_path: Path) -> None:
    prompt, next_token = [1, 5, 7, 9, 11], 42
    want = _logits(source, prompt, next_token)
    got = _logits(rewritten, prompt, next_token)
    exact = _exact_arithmetic_copy(source, tmp_path / "exact")
    want_exact = _logits(exact, prompt, next_token)
    for w, g in zip(want, got):
        assert w.shape == g.shape
        scale = np.abs(w).max()
        np.testing.assert_allclose(g, w, rtol=0, atol=LEVEL4_TOL * scale)
    exact_rewritten = tmp_path / "exact-rewritten"
    rewrite_folder(exact, exact_rewritten)
    got_exact = _logits(exact_rewritten, prompt, next_token)
    for w, g in zip(want_exact, got_exact):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.abs(w).max())


def _count_ms_matmul(path: Path) -> int:
    model = onnx.load(str(path), load_external_data=False)
    return sum(n.op_type == "MatMulNBits" and n.domain == "com.microsoft" for n in model.graph.node)


def test_rewritten_folder_runs_in_onnxruntime_genai(genai_qwen3, tmp_path):
    out = tmp_path / "rewritten"
    report = rewrite_folder(genai_qwen3, out)
    expected = _count_ms_matmul(genai_qwen3 / "model.onnx")
    assert expected > 0 and report.models["model.onnx"].count == expected
    assert _count_ms_matmul(out / "model.onnx") == 0
    # weights shared, not copied
    assert (out / "model.onnx.data").samefile(genai_qwen3 / "model.onnx.data")
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["decoder"]["session_options"][GENAI_LIBRARY_KEY] == report.library

    _check_logits(genai_qwen3, out, tmp_path)


def test_without_the_library_key_genai_cannot_load_it(genai_qwen3, tmp_path):
    """The session option is what makes genai load the library: without it the ort_mtp domain is unknown."""
    out = tmp_path / "rewritten"
    rewrite_folder(genai_qwen3, out)
    config_path = out / "genai_config.json"
    config = json.loads(config_path.read_text())
    del config["model"]["decoder"]["session_options"][GENAI_LIBRARY_KEY]
    config_path.write_text(json.dumps(config))
    with pytest.raises(Exception, match="ort_mtp"):
        og.Model(str(out))


def test_qwen35_blocks_on_gated_delta_net_run_in_onnxruntime_genai(builder_loadable_copy, tmp_path):
    """The builder's Qwen3.5 folder (Gated DeltaNet layers) rewritten with every rewrite: onnxruntime-genai
    runs its linear-attention blocks as ort_mtp GatedDeltaNet nodes and its attention mixer as one ort_mtp
    GatedAttention (its own KV buffers, not shared on CPU), with the logits of the original
    folder run with exact arithmetic, within float32 rounding."""
    import ops
    import ops.linear_attention

    missing = ops.linear_attention.available(ops.library_path())
    if missing:
        pytest.skip(f"needs ort_mtp::GatedDeltaNet in the library: {missing}")
    out = tmp_path / "rewritten"
    report = rewrite_folder(builder_loadable_copy, out)
    blocks = report.models["model.onnx"].linear_attention
    assert len(blocks.rewritten) == blocks.total == 3 and report.models["model.onnx"].count > 0
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert sum(n.op_type == "GatedDeltaNet" and n.domain == "ort_mtp" for n in model.graph.node) == 3
    assert not any(n.op_type == "LinearAttention" for n in model.graph.node)
    attention = report.models["model.onnx"].attention  # its attention layer on ort_mtp GroupQueryAttention,
    assert len(attention.rewritten) == attention.total == 1  # then the whole mixer one ort_mtp GatedAttention
    mixers = report.models["model.onnx"].gated_attention
    assert len(mixers.rewritten) == mixers.total == 1
    assert [n.domain for n in model.graph.node if n.op_type == "GatedAttention"] == ["ort_mtp"]
    assert not any(n.op_type in ("GroupQueryAttention", "MRotaryEmbedding") for n in model.graph.node)
    _check_logits(builder_loadable_copy, out, tmp_path)
