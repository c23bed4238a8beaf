"""`python -m ops info`: what was built (the library, whether its CUDA kernels are in it) and what was
found (ONNX Runtime and its providers, GPUs, CuPy, onnxruntime-genai), as text or JSON."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
from pathlib import Path

import onnxruntime as ort
import pytest

import ops
from ops.__main__ import main


def has_cuda_registration(library: str) -> bool:
    """An independent sign of a CUDA build: only the CUDA kernels' registration names the CUDA EP."""
    return b"CUDAExecutionProvider" in Path(library).read_bytes()


def cupy_importable() -> bool:
    try:
        import cupy  # noqa: F401
    except Exception:
        return False
    return True


def genai_version() -> str | None:
    try:
        return importlib.metadata.version("onnxruntime-genai")
    except importlib.metadata.PackageNotFoundError:
        return None


def info(capsys, *args: str) -> str:
    assert main(["info", *args]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


def test_json_reports_the_library_onnxruntime_and_what_is_installed(capsys):
    report = json.loads(info(capsys, "--json"))
    library = ops.library_path()
    assert report["library"] == library and "library_error" not in report
    assert report["cuda_kernels"] is has_cuda_registration(library)
    assert report["onnxruntime"] == ort.__version__ and report["providers"] == ort.get_available_providers()
    assert (report["cupy"] is not None) == cupy_importable()
    assert report["onnxruntime_genai"] == genai_version()
    assert isinstance(report["gpus"], list)


def test_text_says_the_same_one_line_per_item(capsys):
    lines = info(capsys).splitlines()
    library = ops.library_path()
    by_label = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in lines}
    assert by_label["library"] == library
    assert by_label["CUDA kernels"].startswith("yes" if has_cuda_registration(library) else "no")
    assert by_label["onnxruntime"].startswith(ort.__version__) and "CPUExecutionProvider" in by_label["onnxruntime"]
    assert by_label["CuPy"].startswith("not importable") != cupy_importable()
    assert by_label["onnxruntime-genai"] == (genai_version() or "not installed")


def test_a_missing_library_is_reported_not_an_error(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("ORT_MTP_LIBRARY", str(tmp_path / "nothing.so"))
    report = json.loads(info(capsys, "--json"))
    assert report["library"] is None and report["cuda_kernels"] is None
    assert "ORT_MTP_LIBRARY" in report["library_error"]
    assert f"library:           missing (ORT_MTP_LIBRARY={tmp_path / 'nothing.so'}" in info(capsys)


def test_cuda_kernels_are_found_by_the_device_code_section(tmp_path):
    """nvcc's device code lives in the ELF section .nv_fatbin: a library with one is a CUDA build."""
    assert ops.cuda_kernels_built() is has_cuda_registration(ops.library_path())
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to make a library with a .nv_fatbin section")
    source = tmp_path / "fatbin.c"
    source.write_text('__attribute__((section(".nv_fatbin"))) const char device_code[] = "cubin";\n')
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(tmp_path / "libcuda_like.so"), str(source)], check=True)
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(tmp_path / "libplain.so"), "-x", "c", os.devnull],
                   check=True)
    assert ops.cuda_kernels_built(tmp_path / "libcuda_like.so") is True
    assert ops.cuda_kernels_built(tmp_path / "libplain.so") is False
    (tmp_path / "text.so").write_text("not a library")
    with pytest.raises(ValueError, match="not a 64-bit little-endian ELF library"):
        ops.cuda_kernels_built(tmp_path / "text.so")


def fake_nvidia_smi(folder: Path, output: str, status: int = 0) -> None:
    tool = folder / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\nprintf '%s' '{output}'\nexit {status}\n")
    tool.chmod(0o755)


@pytest.mark.parametrize("output, status, expected", [
    ("GPU 0: NVIDIA H200 (UUID: GPU-1)\nGPU 1: NVIDIA H200 (UUID: GPU-2)\n", 0,
     ["GPU 0: NVIDIA H200 (UUID: GPU-1)", "GPU 1: NVIDIA H200 (UUID: GPU-2)"]),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", 9, []),
])
def test_gpus_are_what_nvidia_smi_lists(capsys, monkeypatch, tmp_path, output, status, expected):
    fake_nvidia_smi(tmp_path, output, status)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert ops.visible_gpus() == expected
    assert json.loads(info(capsys, "--json"))["gpus"] == expected
    gpu_lines = [line.split(":", 1)[1].strip() for line in info(capsys).splitlines() if line.startswith("GPU:")]
    assert gpu_lines == (expected or ["none (no NVIDIA driver or device found)"])
