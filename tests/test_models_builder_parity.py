"""Our folders against onnxruntime-genai's own builder, and the `convert` wrapper around it.

A random Hugging Face Qwen3.5 checkpoint of the tiny preset's shape (MTP weights included) goes
through the builder (via models.convert); our build of the same shape must be structurally
identical: op types and counts, every node's inputs/outputs/attributes, graph I/O names, dtypes
and shapes, initializer names/dtypes/shapes/data files, value_info, genai_config keys and values -- for each precision/EP/state window.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest

from genai_helpers import genai_greedy
from models.build import build
from models.compare import compare_folders
from models.config import BuildOptions, preset
from models.convert import ConvertError, convert

pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai's builder is the reference")
torch = pytest.importorskip("torch", reason="the reference checkpoint is made with torch (CI installs it)")
pytest.importorskip("transformers", reason="the reference checkpoint is made with transformers (CI installs it)")

TINY = preset("tiny")
# (fp16 on CPU is deliberately not the builder's graph: see test_models_build.py)
TARGETS = [("int4", "cpu", 0), ("fp32", "cpu", 0), ("int4", "cuda", 4), ("fp16", "cuda", 0)]


@pytest.fixture(scope="module")
def hf_tiny(tmp_path_factory):
    from models.hf_checkpoint import make_checkpoint

    return make_checkpoint(TINY, tmp_path_factory.mktemp("hf_tiny"))


@pytest.fixture(scope="module")
def builder_runs(hf_tiny, tmp_path_factory):
    """Every builder run of the module, started at once, two at a time: each is a Python process that
    spends most of its time importing torch, so a second core halves the wait. key -> (output folder,
    future of convert()'s report) for each of TARGETS, "no-mtp" (fp32 CPU without the head) and
    "broken" (a checkpoint of a model type the builder does not know)."""
    broken = tmp_path_factory.mktemp("broken") / "hf"
    broken.mkdir()
    (broken / "config.json").write_text('{"architectures": ["NoSuchModelForCausalLM"], "model_type": "nope"}')
    jobs = {(precision, ep, window): (hf_tiny, dict(precision=precision, ep=ep, state_window=window))
            for precision, ep, window in TARGETS}  # submitted first: the module's first tests read them
    jobs["no-mtp"] = (hf_tiny, dict(precision="fp32", ep="cpu", exclude_mtp=True))
    jobs["broken"] = (broken, dict(precision="fp32", ep="cpu"))
    pool = ThreadPoolExecutor(2)
    runs = {}
    for key, (checkpoint, options) in jobs.items():
        out = tmp_path_factory.mktemp("builder") / "model"
        runs[key] = (out, pool.submit(convert, checkpoint, out, **options))
    pool.shutdown(wait=False)  # the runs go on; each test waits for the one it reads
    return runs


@pytest.fixture(scope="module")
def converted(builder_runs):
    """The builder's folders, one per target, made once for the module."""
    return {target: (out, run.result()) for target, (out, run) in builder_runs.items() if target in TARGETS}


@pytest.mark.parametrize("precision, ep, window", TARGETS)
def test_build_is_structurally_identical_to_the_builder(converted, tmp_path, precision, ep, window):
    theirs, _ = converted[precision, ep, window]
    ours = tmp_path / "ours"
    build(TINY, ours, BuildOptions(precision=precision, ep=ep, state_window=window))
    assert compare_folders(ours, theirs) == []


def test_comparison_notices_a_difference(converted, tmp_path):
    """The comparison is not vacuous: a different state window or precision is reported."""
    theirs, _ = converted["int4", "cuda", 4]
    ours = tmp_path / "ours"
    build(TINY, ours, BuildOptions(precision="int4", ep="cuda", state_window=2))
    diffs = compare_folders(ours, theirs)
    assert any("state_window" in d for d in diffs) and any("past.0.conv" in d for d in diffs)


def test_convert_cpu_folder_loads_and_generates_in_genai(converted):
    og = pytest.importorskip("onnxruntime_genai")
    out, result = converted["int4", "cpu", 0]
    assert result["removed_cpu_shared_initializers"] is True
    assert result["renamed_tokenizer_class"] == "Qwen3_5Tokenizer"
    model = og.Model(str(out))
    tokenizer = og.Tokenizer(model)
    prompt = [int(t) for t in tokenizer.encode("hello world")]
    assert len(genai_greedy(model, prompt, 8)) == 8


def test_convert_cuda_keeps_shared_initializers_and_state_window(converted):
    out, result = converted["int4", "cuda", 4]
    config = json.loads((out / "genai_config.json").read_text())
    assert result["removed_cpu_shared_initializers"] is False
    assert [s["name"] for s in config["model"]["mtp"]["shared_initializers"]][0] == "model.embed_tokens.weight"
    model = onnx.load(out / "model.onnx", load_external_data=False)
    conv = next(v for v in model.graph.input if v.name == "past.0.conv")
    assert conv.type.tensor_type.shape.dim[0].dim_value == 4


def test_convert_exclude_mtp(builder_runs):
    out, run = builder_runs["no-mtp"]
    run.result()
    config = json.loads((out / "genai_config.json").read_text())
    assert "mtp" not in config["model"] and not (out / "mtp.onnx").exists()


def test_convert_reports_a_failed_builder_run_in_one_line(builder_runs):
    with pytest.raises(ConvertError, match="builder failed") as info:
        builder_runs["broken"][1].result()
    assert "\n" not in str(info.value)
