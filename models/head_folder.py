"""A standalone folder for a model folder's MTP head, the form onnxruntime-genai's
`og.MtpGenerator(main_model, head_model, params)` takes the head in.

Its genai_config is the main one with the decoder replaced by the `mtp` section (filename mtp.onnx,
one layer, the head's inputs incl. hidden_states and outputs incl. hidden_states_out). The ONNX and
data files are symlinked (mtp.onnx reads the embedding and lm_head from model.onnx.data, so that
file is linked too); nothing is copied.

onnxruntime-genai 0.18's MtpGenerator needs fp16 hidden states: on the CPU EP use an fp16 build
(`--precision fp16 --ep cpu`); an fp32 folder fails inside it ("Cast - input and output types are
the same").
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ops.staging import check_output, staged_folder

from .config import ConfigError

LINKED = ("mtp.onnx", "mtp.onnx.data", "model.onnx.data", "tokenizer.json", "tokenizer_config.json")


def write_head_folder(folder: str | os.PathLike, out: str | os.PathLike) -> Path:
    folder, out = Path(folder).resolve(), Path(out)
    config_path = folder / "genai_config.json"
    if not config_path.is_file():
        raise ConfigError(f"{folder} is not a model folder (no genai_config.json)")
    config = json.loads(config_path.read_text())
    model = config["model"]
    mtp = model.pop("mtp", None)
    if mtp is None:
        raise ConfigError(f"{folder} has no MTP head (no 'mtp' section in genai_config.json)")
    check_output(out, source=folder)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"output {out} exists and is not an empty folder")
    decoder = model["decoder"]
    decoder["filename"] = mtp["filename"]
    decoder["num_hidden_layers"] = mtp["num_hidden_layers"]
    decoder["inputs"] = dict(mtp["inputs"])
    decoder["outputs"] = dict(mtp["outputs"])
    with staged_folder(out) as staging:  # the folder appears complete, or not at all
        for name in LINKED:
            if (folder / name).exists():
                os.symlink(folder / name, staging / name)
        (staging / "genai_config.json").write_text(json.dumps(config, indent=4))
    return out
