"""Shared fixtures: the custom-op library, CPU sessions that have it registered, and the model folders
the driver tests run (each built once per test session and only read: a test that changes a folder
works on its own copy)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

import ops
import ops.progress


@pytest.fixture(scope="session")
def library_path() -> str:
    """The library under test (ORT_MTP_LIBRARY overrides the installed one)."""
    return ops.library_path()


@pytest.fixture(scope="session")
def cpu_session(library_path):
    """cpu_session(model or path, register=True, threads=None) -> onnxruntime.InferenceSession on the
    CPU EP with the library registered (threads: intra_op_num_threads; None: ORT's default). ORT's own
    error log is silenced: tests read errors from exceptions."""

    def make(model, register: bool = True, threads: int | None = None) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads is not None:
            options.intra_op_num_threads = threads
        if register:
            options.register_custom_ops_library(library_path)
        source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])

    return make


@pytest.fixture(scope="session")
def rerun_on_reference_kernels(library_path):
    """rerun_on_reference_kernels(test_file, selection): runs the tests of `test_file` that `-k selection`
    picks in a new process with ORT_MTP_CPU_KERNEL=reference (the CPU kernels' double references, which
    a process picks once), and asserts they ran and passed: how a module holds both a fast kernel and
    its reference to its tests."""

    def run(test_file: str, selection: str) -> None:
        here = Path(test_file).resolve()
        env = dict(os.environ, ORT_MTP_CPU_KERNEL="reference", ORT_MTP_LIBRARY=library_path)
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(here),
                              "-k", selection], env=env, cwd=here.parents[1], capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
        assert " passed" in out.stdout and "failed" not in out.stdout, out.stdout[-2000:]

    return run


class _Terminal(io.StringIO):
    """A stream that says it is a terminal, as sys.stdout and sys.stderr are in an interactive shell,
    and keeps what is written to it."""

    def isatty(self) -> bool:
        return True


@pytest.fixture()
def terminal(monkeypatch):
    """terminal("stderr") (or "stdout") replaces that stream with a terminal and returns it. Progress
    bars show at once: the tests' steps end before ops.progress's real delay."""
    monkeypatch.setattr(ops.progress, "DELAY_S", 0)

    def attach(name: str) -> _Terminal:
        stream = _Terminal()
        monkeypatch.setattr(sys, name, stream)
        return stream

    return attach


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory) -> Path:
    """The models package's tiny preset (int4, CPU): what the README's first command runs."""
    from models.build import build
    from models.config import BuildOptions, preset

    out = tmp_path_factory.mktemp("tiny") / "model"
    build(preset("tiny"), out, BuildOptions(precision="int4", ep="cpu"))
    return out


@pytest.fixture(scope="session")
def builder_folders(tmp_path_factory) -> dict[str, Path]:
    """onnxruntime-genai's builder on the tiny random checkpoint (genai_builder.py): int4 for CPU, and
    for CUDA with state_window=4 (read here, run only on a GPU). The two builder runs go at once:
    each is a Python process that spends most of its time importing torch, so a second core halves
    the wait."""
    from genai_builder import make_checkpoint, run_genai_builder

    checkpoint = make_checkpoint(tmp_path_factory.mktemp("hf") / "hf")
    targets = {"cpu": ("cpu", None), "cuda-w4": ("cuda", "state_window=4")}
    with ThreadPoolExecutor(len(targets)) as pool:
        runs = {name: pool.submit(run_genai_builder, checkpoint, tmp_path_factory.mktemp(f"genai-{name}") / "model",
                                  ep, extra)
                for name, (ep, extra) in targets.items()}
    return {name: run.result() for name, run in runs.items()}


@pytest.fixture(scope="session")
def builder_attention_first_folder(tmp_path_factory) -> Path:
    """The builder's int4 CPU export of a checkpoint whose full-attention layer comes first (then three
    linear-attention layers): attention's rows then feed the states a verify commits."""
    from genai_builder import make_checkpoint, run_genai_builder

    layers = ["full_attention", "linear_attention", "linear_attention", "linear_attention"]
    checkpoint = make_checkpoint(tmp_path_factory.mktemp("hf-attention-first") / "hf", layer_types=layers)
    return run_genai_builder(checkpoint, tmp_path_factory.mktemp("genai-attention-first") / "model")


@pytest.fixture(scope="session")
def builder_folder(builder_folders) -> Path:
    """The builder's int4 CPU export, as it wrote it (shared_initializers included: the builder shares
    the embedding and lm_head between model.onnx and mtp.onnx)."""
    return builder_folders["cpu"]


@pytest.fixture(scope="session")
def builder_windowed_folder(builder_folders) -> Path:
    """The builder's CUDA export of the same checkpoint with state_window=4."""
    return builder_folders["cuda-w4"]


@pytest.fixture(scope="session")
def builder_loadable_copy(builder_folder, tmp_path_factory) -> Path:
    """builder_folder as onnxruntime-genai 0.18 itself loads it on CPU: it refuses a genai_config with
    shared_initializers there ("GetMemoryInfo for CPU should not be used"), so the copy drops that
    key; the graphs and weights are the same files (mtp.onnx still reads model.onnx.data)."""
    dst = tmp_path_factory.mktemp("genai-copy") / "model"
    shutil.copytree(builder_folder, dst)
    config = json.loads((dst / "genai_config.json").read_text())
    for section in ("decoder", "mtp"):
        config["model"].get(section, {}).pop("shared_initializers", None)
    (dst / "genai_config.json").write_text(json.dumps(config, indent=4))
    return dst
