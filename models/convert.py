"""Thin wrapper over onnxruntime-genai's builder for real Hugging Face checkpoints:

    python -m onnxruntime_genai.models.builder -i HF_DIR -o OUT -p PRECISION -e EP \
        --extra_options state_window=W [exclude_mtp=true]

It checks its inputs first (so a typo fails in a second, not after loading a checkpoint) and fixes
two things in the written folder that onnxruntime-genai 0.18 itself cannot load:
- for --ep cpu it removes `shared_initializers` from genai_config.json: 0.18 refuses them on CPU
  ("GetMemoryInfo for CPU should not be used"); the ONNX files keep reading the shared tensors from
  model.onnx.data, so nothing else changes;
- transformers 5 saves Qwen3.5 tokenizers as tokenizer_class "Qwen3_5Tokenizer", which 0.18's
  tokenizer rejects ("Unsupported tokenizer class"); it is the same byte-level BPE as
  "Qwen2Tokenizer", so the class name is rewritten to that.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ops.staging import staged_folder

BUILDER_PRECISIONS = ("int4", "int8", "bf16", "fp16", "fp32")
BUILDER_EPS = ("cpu", "cuda")


class ConvertError(ValueError):
    """Bad arguments or a failed builder run (message is one line)."""


def builder_command(hf_dir: str, out: str, precision: str, ep: str, cache_dir: str, state_window: int,
                    exclude_mtp: bool) -> list[str]:
    extra = [f"state_window={state_window}"]
    if exclude_mtp:
        extra.append("exclude_mtp=true")
    return [
        sys.executable, "-m", "onnxruntime_genai.models.builder",
        "-i", hf_dir, "-o", out, "-p", precision, "-e", ep, "-c", cache_dir,
        "--extra_options", *extra,
    ]


def _check(hf_dir: Path, out: Path, precision: str, ep: str, state_window: int) -> None:
    if not hf_dir.is_dir():
        raise ConvertError(f"{hf_dir} is not a directory")
    if not (hf_dir / "config.json").is_file():
        raise ConvertError(f"{hf_dir} has no config.json (not a Hugging Face checkpoint folder)")
    if precision not in BUILDER_PRECISIONS:
        raise ConvertError(f"precision must be one of {', '.join(BUILDER_PRECISIONS)}, got {precision!r}")
    if ep not in BUILDER_EPS:
        raise ConvertError(f"ep must be one of {', '.join(BUILDER_EPS)}, got {ep!r}")
    from ops.state_window import window_out_of_range

    if why := window_out_of_range(state_window):
        raise ConvertError(why)
    if state_window and ep != "cuda":
        raise ConvertError("state_window > 0 needs --ep cuda (ONNX Runtime implements it only in CUDA kernels)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConvertError(f"output {out} exists and is not an empty folder")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def strip_cpu_shared_initializers(out: Path) -> bool:
    path = out / "genai_config.json"
    config = json.loads(path.read_text())
    removed = False
    for section in ("decoder", "mtp"):
        part = config["model"].get(section)
        if part is not None and part.pop("shared_initializers", None) is not None:
            removed = True
    if removed:
        path.write_text(json.dumps(config, indent=4))
    return removed


# tokenizer classes transformers writes that onnxruntime-genai 0.18 does not know -> a known equivalent
TOKENIZER_CLASS_FIXES = {"Qwen3_5Tokenizer": "Qwen2Tokenizer"}


def fix_tokenizer_class(out: Path) -> str | None:
    path = out / "tokenizer_config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    old = config.get("tokenizer_class")
    if old not in TOKENIZER_CLASS_FIXES:
        return None
    config["tokenizer_class"] = TOKENIZER_CLASS_FIXES[old]
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False))
    return old


def convert(hf_dir, out, precision: str = "int4", ep: str = "cuda", state_window: int = 0,
            exclude_mtp: bool = False, cache_dir: str | None = None) -> dict:
    """The builder writes into a staging folder next to `out`, renamed to `out` once the builder
    has finished and the fixes are applied (ops.staging): a failed run leaves no half folder."""
    hf_dir, out = Path(hf_dir), Path(out)
    _check(hf_dir, out, precision, ep, state_window)
    start = time.perf_counter()
    with staged_folder(out) as staging:
        with tempfile.TemporaryDirectory(prefix="builder-cache-") as tmp:
            command = builder_command(str(hf_dir), str(staging), precision, ep, cache_dir or tmp, state_window,
                                      exclude_mtp)
            result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            last = _last_line(result.stderr or result.stdout)
            raise ConvertError(f"builder failed (exit {result.returncode}): {last}")
        if not (staging / "genai_config.json").is_file():
            raise ConvertError(f"builder wrote no genai_config.json: {_last_line(result.stdout)}")
        stripped = strip_cpu_shared_initializers(staging) if ep == "cpu" else False
        renamed = fix_tokenizer_class(staging)
    return {
        "out": str(out),
        "command": command,
        "seconds": time.perf_counter() - start,
        "removed_cpu_shared_initializers": stripped,
        "renamed_tokenizer_class": renamed,
        "files": {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()},
    }
