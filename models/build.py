"""Builds a complete onnxruntime-genai model folder for a synthetic Qwen3.5-class model:
genai_config.json, model.onnx + model.onnx.data, mtp.onnx + mtp.onnx.data, tokenizer files."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ops.progress import progress_bar
from ops.staging import staged_folder

from .config import BuildOptions, ConfigError, Qwen35Shape
from .genai_config import make_genai_config, shared_initializer_entries
from .graph import Emitter, build_decoder, build_mtp
from .onnx_writer import DTYPES, ExternalData, GraphWriter, save
from .tokenizer import write_tokenizer_files
from .weights import workers

VERSION = "0.2.0"  # bumped whenever the bytes a build writes change (caches key on it)
FOLDER_FILES = (
    "genai_config.json",
    "model.onnx",
    "model.onnx.data",
    "mtp.onnx",
    "mtp.onnx.data",
    "tokenizer.json",
    "tokenizer_config.json",
)


@dataclass
class BuildResult:
    folder: str
    preset: str
    precision: str
    ep: str
    state_window: int
    seed: int
    mtp_noise: float
    out_scale: float
    seconds: float
    bytes_on_disk: int
    files: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def check_out_folder(out: Path, overwrite: bool) -> None:
    """The folder must be new or empty; with overwrite it may hold a previous build (only the files
    a build writes), which is replaced once the new one is complete."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output {out} exists and is not a directory")
    if out.is_dir():
        present = [p.name for p in out.iterdir()]
        if present and not overwrite:
            raise ConfigError(f"output folder {out} is not empty (pass --overwrite to replace a previous build)")
        foreign = [p for p in present if p not in FOLDER_FILES]
        if foreign:  # --overwrite replaces the whole folder: never one that holds anything else
            raise ConfigError(f"output folder {out} holds files a build does not write: {', '.join(sorted(foreign)[:5])}")


def build(shape: Qwen35Shape, out: str | os.PathLike, options: BuildOptions, overwrite: bool = False,
          threads: int | None = None) -> BuildResult:
    """Writes the folder `out`. It is built in a staging folder next to it and renamed into place
    when complete (ops.staging), so a failed or interrupted build leaves `out` as it was. Where
    stderr is a terminal, a bar there counts the weight bytes written (ops.progress)."""
    shape.validate()
    options.validate()
    out = Path(out)
    check_out_folder(out, overwrite)
    with staged_folder(out, overwrite=overwrite) as staging, \
            progress_bar(f"building {shape.name}", unit="B", unit_scale=True) as bar:
        result = _write_folder(shape, options, staging, threads or workers(), bar)
    result.folder = str(out)  # _write_folder saw the staging folder's path
    return result


class _CountedData(ExternalData):
    """An external-data file that moves a progress bar by every chunk written into it."""

    def __init__(self, folder: Path, filename: str, bar):
        super().__init__(folder, filename)
        self.bar = bar

    def write(self, name, nbytes, chunks):
        return super().write(name, nbytes, self._counted(chunks))

    def _counted(self, chunks):
        for chunk in chunks:
            yield chunk
            self.bar.update(chunk.nbytes)  # runs once the chunk is written: write() asks for the next


def _write_folder(shape: Qwen35Shape, options: BuildOptions, out: Path, threads: int, bar) -> BuildResult:
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) if threads > 1 else nullcontext(None) as pool:
        specials = write_tokenizer_files(out, shape.vocab_size, shape.context_length)

        main_data = _CountedData(out, "model.onnx.data", bar)
        main = GraphWriter(main_data)
        build_decoder(Emitter(shape, options, main, pool), specials.all)
        main_data.close()
        save(main.to_model(VERSION), out / "model.onnx")

        mtp_data = _CountedData(out, "mtp.onnx.data", bar)
        mtp = GraphWriter(mtp_data)
        build_mtp(Emitter(shape, options, mtp, pool, stream_prefix="mtp:", shared_from=main_data), specials.all)
        mtp_data.close()
        save(mtp.to_model(VERSION), out / "mtp.onnx")

    shared_shapes = {
        t.name: (_dtype_name(t.data_type), list(t.dims))
        for t in main.initializers
        if t.name == "model.embed_tokens.weight" or t.name.startswith("lm_head.MatMul.")
    }
    shared = shared_initializer_entries(main_data, shared_shapes)
    with open(out / "genai_config.json", "w") as f:
        json.dump(make_genai_config(shape, options, specials, shared), f, indent=4)

    files = {name: (out / name).stat().st_size for name in FOLDER_FILES}
    syn = options.synthesis
    return BuildResult(
        folder=str(out), preset=shape.name, precision=options.precision, ep=options.ep,
        state_window=options.state_window, seed=syn.seed, mtp_noise=syn.mtp_noise, out_scale=syn.out_scale,
        seconds=time.perf_counter() - start, bytes_on_disk=sum(files.values()), files=files,
    )


def _dtype_name(data_type: int) -> str:
    return next(name for name, (_, onnx_type) in DTYPES.items() if onnx_type == data_type)
