"""Shared fixtures: the custom-op library and CPU sessions that have it registered."""

import onnx
import onnxruntime as ort
import pytest

import ops


@pytest.fixture(scope="session")
def library_path() -> str:
    """The library under test (ORT_MTP_LIBRARY overrides the installed one)."""
    return ops.library_path()


@pytest.fixture(scope="session")
def cpu_session(library_path):
    """cpu_session(model or path, register=True) -> onnxruntime.InferenceSession on the CPU EP with
    the library registered. ORT's own error log is silenced: tests read errors from exceptions."""

    def make(model, register: bool = True) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if register:
            options.register_custom_ops_library(library_path)
        source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])

    return make
