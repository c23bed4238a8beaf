"""The model used when no --model is given: the trained default the models package ships
(models/data/trained: a ~12M-parameter Qwen3.5-architecture model with its MTP head, trained on Python
source, int4 for the CPU; its PROVENANCE.md says how it was made). It is read where it is installed
and never written: like any model folder, the driver only reads it (the rewrite happens in memory).
"""

from __future__ import annotations

from pathlib import Path

from .errors import DriverError


def default_model_folder(log=None) -> Path:
    """The folder of the default model."""
    try:
        from models.defaults import TRAINED_FOLDER
    except ImportError as e:
        raise DriverError(f"no --model given and the models package that ships the default model is "
                          f"unavailable ({e}); pass --model DIR") from None
    if not (TRAINED_FOLDER / "genai_config.json").is_file():
        raise DriverError(f"the default model's folder {TRAINED_FOLDER} is missing or incomplete (a broken "
                          "install?); reinstall the package, or pass --model DIR")
    return TRAINED_FOLDER
