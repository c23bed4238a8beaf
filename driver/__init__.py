"""Greedy and MTP self-speculative generation for onnxruntime-genai Qwen3.5-family model folders.

    from driver import Generator
    gen = Generator("folder", provider="cpu", mode="mtp", draft_tokens=3)
    result = gen.generate("Once upon a time", max_new_tokens=64)

`python -m driver generate --help` is the command-line front end.
"""


import importlib

# The names load on first use (PEP 562), so that `python -m driver` imports nothing heavy (numpy,
# onnx, onnxruntime) before driver/__main__.py has installed its Ctrl-C handler.
_EXPORTS = {"DriverError": ".errors", "ModelFolder": ".folder", "read_folder": ".folder",
            "GenerationResult": ".generator", "Generator": ".generator", "MAX_DRAFT_TOKENS": ".generator"}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
