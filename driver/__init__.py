"""Greedy and MTP self-speculative generation for onnxruntime-genai Qwen3.5-family model folders.

    from driver import Generator
    gen = Generator("folder", provider="cpu", mode="mtp", draft_tokens=3)
    result = gen.generate("Once upon a time", max_new_tokens=64)

`python -m driver generate --help` is the command-line front end.
"""

from .errors import DriverError
from .folder import ModelFolder, read_folder
from .generator import MAX_DRAFT_TOKENS, GenerationResult, Generator

__all__ = ["DriverError", "GenerationResult", "Generator", "MAX_DRAFT_TOKENS", "ModelFolder", "read_folder"]
