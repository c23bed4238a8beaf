"""The training text: Python source that is on every machine with Python (the standard library and the
installed packages' .py files), no download. Files are split by a hash of their path relative to their
root, so the split of a file does not depend on which other files a machine has, and whole files are
held out for evaluation. Duplicate contents (the same module vendored twice) are kept once, under the
first path in sorted order, so a held-out file never appears in training under another name.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HELD_OUT_PERCENT = 5  # of files, by hash
MAX_FILE_BYTES = 200_000  # larger files are mostly generated tables


@dataclass(frozen=True)
class SourceFile:
    name: str  # "<root>/<relative path>": the key of the split
    path: Path

    @property
    def held_out(self) -> bool:
        return int(hashlib.sha256(self.name.encode()).hexdigest()[:8], 16) % 100 < HELD_OUT_PERCENT


def roots() -> dict[str, Path]:
    """Where the files come from: the standard library and the site-packages of this interpreter."""
    paths = sysconfig.get_paths()
    found = {"stdlib": Path(paths["stdlib"]), "purelib": Path(paths["purelib"])}
    if paths.get("platlib") and Path(paths["platlib"]) != found["purelib"]:
        found["platlib"] = Path(paths["platlib"])
    return {k: v for k, v in found.items() if v.is_dir()}


def python_files(limit_bytes: int | None = None) -> list[SourceFile]:
    """Every readable, UTF-8, non-empty .py file under the roots (site-packages inside the stdlib tree
    skipped: counted once, under purelib), deduplicated by content, in sorted order. limit_bytes: stop
    once the kept files' sizes add up to that (a small corpus for tests)."""
    found = roots()
    skip = {p.resolve() for k, p in found.items() if k != "stdlib"}
    files, seen, total = [], set(), 0
    for key, root in found.items():
        for path in sorted(root.rglob("*.py")):
            if key == "stdlib" and any(parent.resolve() in skip for parent in path.parents):
                continue
            try:
                size = path.stat().st_size
                if not 0 < size <= MAX_FILE_BYTES:
                    continue
                data = path.read_bytes()
                data.decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            digest = hashlib.sha256(data).digest()
            if digest in seen:
                continue
            seen.add(digest)
            files.append(SourceFile(f"{key}/{path.relative_to(root).as_posix()}", path))
            total += size
            if limit_bytes is not None and total >= limit_bytes:
                return files
    return files


def split(files: list[SourceFile]) -> tuple[list[SourceFile], list[SourceFile]]:
    train = [f for f in files if not f.held_out]
    held = [f for f in files if f.held_out]
    return train, held


def token_stream(files: list[SourceFile], tokenizer, eos_id: int) -> np.ndarray:
    """The files' tokens, each file followed by <|endoftext|>, as one uint16 array."""
    pieces = []
    batch = 256
    for i in range(0, len(files), batch):
        texts = [f.path.read_text(encoding="utf-8") for f in files[i:i + batch]]
        for encoding in tokenizer.encode_batch(texts):
            pieces.append(np.asarray(encoding.ids + [eos_id], np.uint16))
    return np.concatenate(pieces) if pieces else np.zeros(0, np.uint16)


def manifest(files: list[SourceFile]) -> list[dict]:
    """What a corpus was made of (written beside a checkpoint): names, sizes, split."""
    return [{"name": f.name, "bytes": os.path.getsize(f.path), "held_out": f.held_out} for f in files]


def write_manifest(files: list[SourceFile], path: Path) -> None:
    path.write_text(json.dumps(manifest(files), indent=0))
