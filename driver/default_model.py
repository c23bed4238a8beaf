"""The model used when no --model is given: the models package's `tiny` preset, built once.

It is built into a cache folder (ORT_MTP_CACHE, else $XDG_CACHE_HOME/ort-mtp, else ~/.cache/ort-mtp)
whose name carries the models package version, so a fresh clone needs nothing but `pip install .`
and a newer models package builds a new folder instead of reusing a stale one. The build goes to a
temporary folder renamed into place when complete, so an interrupted build is never used.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .errors import DriverError

PRESET = "tiny"


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
    if (folder / "genai_config.json").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    if log:
        log(f"building the default model (models preset '{PRESET}', int4, CPU) into {folder} (first use only)")
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        build(preset(PRESET), staging / "model", BuildOptions(precision="int4", ep="cpu"))
        try:
            os.replace(staging / "model", folder)
        except OSError:
            if not (folder / "genai_config.json").is_file():  # not a concurrent build that won
                raise
    except (ConfigError, OSError) as e:
        raise DriverError(f"could not build the default model into {folder}: {e}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder
