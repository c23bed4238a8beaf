"""Synthetic Qwen3.5-class model folders in onnxruntime-genai 0.18's format (docs/models.md).

    from models import BuildOptions, Synthesis, build, preset
    build(preset("tiny"), "/tmp/tiny", BuildOptions(precision="int4", ep="cpu"))

Command line: python -m models {build,convert,acceptance,sweep,tokenizer} --help
"""

from .build import BuildResult, build
from .config import PRESETS, BuildOptions, ConfigError, Qwen35Shape, Synthesis, preset

__all__ = ["PRESETS", "BuildOptions", "BuildResult", "ConfigError", "Qwen35Shape", "Synthesis", "build", "preset"]
