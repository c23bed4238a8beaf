"""The model used when no --model is given: the models package's `tiny` preset, built once.

It is built into a cache folder (ORT_MTP_CACHE, else $XDG_CACHE_HOME/ort-mtp, else ~/.cache/ort-mtp)
whose name carries the models package version, so a fresh clone needs nothing but `pip install .`
and a newer models package builds a new folder instead of reusing a stale one. models.build writes
the folder in a staging folder renamed into place when complete (ops.staging), so an interrupted
build is never used.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ops.staging import OutputError

from .errors import DriverError

PRESET = "tiny"
_UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)  # permission denied, read-only file system


def cache_root() -> Path:
    if os.environ.get("ORT_MTP_CACHE"):
        return Path(os.environ["ORT_MTP_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ort-mtp"


def default_model_folder(log=None) -> Path:
    """The folder of the default model, building it on first use."""
    try:
        from models.build import VERSION, build
        from models.config import BuildOptions, ConfigError, preset
    except ImportError as e:
        raise DriverError(f"no --model given and the models package that builds the default model is "
                          f"unavailable ({e}); pass --model DIR") from None
    folder = cache_root() / f"{PRESET}-int4-cpu-models{VERSION}"
    if _is_built(folder):
        return folder
    if log:
        log(f"building the default model (models preset '{PRESET}', int4, CPU) into {folder} (first use only)")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        build(preset(PRESET), folder, BuildOptions(precision="int4", ep="cpu"))
    except (ConfigError, OutputError, OSError) as e:
        if _is_built(folder):  # a concurrent first use renamed its complete build into place first
            return folder
        if isinstance(e, OSError) and e.errno in _UNWRITABLE:
            raise DriverError(f"cannot write the default model's cache folder {folder.parent} ({e.strerror}); "
                              "set ORT_MTP_CACHE to a writable folder, or pass --model DIR") from None
        raise DriverError(f"could not build the default model into {folder}: {e}") from None
    return folder


def _is_built(folder: Path) -> bool:
    # The folder only ever appears complete (it is renamed into place), so its config marks it.
    return (folder / "genai_config.json").is_file()
