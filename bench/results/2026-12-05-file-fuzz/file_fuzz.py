"""Damaged model folders against the two command lines, in process: every run must end in a one-line
error (the CLI's exit status 2) or a normal run, never an exception escaping main() (a traceback).

    python bench/results/2026-12-05-file-fuzz/file_fuzz.py TARGET KIND --folder F --seed S --trials N

TARGET: driver (`python -m driver generate --model COPY ...`) or ops (`python -m ops rewrite COPY OUT`).
KIND: config (random values or deletions at random places of genai_config.json), graph (bytes of
model.onnx or mtp.onnx flipped, zeroed or cut off) or tokenizer (tokenizer.json / tokenizer_config.json
flipped, cut off, or a top-level value replaced). F is an intact folder (the tiny preset: `python -m
models build --preset tiny --out F`); a copy of it is damaged, F is not touched. Prints each finding
(the exception and the traceback's tail) and, last, "findings N".
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import random
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

VALUES = [None, 0, -1, 1, 2, 3, 7, 1 << 40, -(1 << 62), 10**30, 1.5, float("nan"), "", "x", "model.onnx",
          "mtp.onnx", "../x.onnx", "/etc/passwd", [], {}, [1, 2], True, False]


def paths(obj, prefix=()):
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield prefix + (key,)
            yield from paths(value, prefix + (key,))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield prefix + (i,)
            yield from paths(value, prefix + (i,))


def damage_config(rng, original: bytes) -> tuple[bytes, list]:
    config = json.loads(original)
    where, changes = list(paths(config)), []
    for _ in range(rng.choice([1, 1, 2])):
        path = rng.choice(where)
        parent = config
        try:
            for key in path[:-1]:
                parent = parent[key]
            if rng.random() < 0.2 and isinstance(parent, dict):
                del parent[path[-1]]
                changes.append(("delete", path))
            else:
                value = rng.choice(VALUES)
                parent[path[-1]] = value
                changes.append(("set", path, value))
        except (KeyError, IndexError, TypeError):  # an earlier change removed or replaced the path
            continue
    return json.dumps(config).encode(), changes


def damage_bytes(rng, original: bytes) -> tuple[bytes, list]:
    data = bytearray(original)
    how = rng.choice(["flip", "flip", "cut", "zero"])
    if how == "flip":
        for _ in range(rng.choice([1, 2, 4, 16])):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif how == "cut":
        data = data[:rng.randrange(len(data))]
    else:
        i, n = rng.randrange(len(data)), rng.randrange(1, 64)
        data[i:i + n] = bytes(min(n, len(data) - i))
    return bytes(data), [how]


def damage_tokenizer(rng, original: bytes) -> tuple[bytes, list]:
    if rng.random() < 2 / 3:
        return damage_bytes(rng, original)
    value = json.loads(original)
    key = rng.choice(list(value))
    value[key] = rng.choice([None, 0, "x", [], {}, 1 << 40])
    return json.dumps(value).encode(), [("set", key)]


KINDS = {"config": (["genai_config.json"], damage_config),
         "graph": (["model.onnx", "mtp.onnx"], damage_bytes),
         "tokenizer": (["tokenizer.json", "tokenizer_config.json"], damage_tokenizer)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", choices=["driver", "ops"])
    ap.add_argument("kind", choices=list(KINDS))
    ap.add_argument("--folder", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trials", type=int, default=300)
    args = ap.parse_args()
    if args.target == "driver":
        from driver.cli import main as cli
    else:
        from ops.__main__ import main as cli
    names, damage = KINDS[args.kind]
    source = Path(args.folder)
    originals = {name: (source / name).read_bytes() for name in names}
    work = Path(tempfile.mkdtemp(prefix="file-fuzz-"))
    folder, out = work / "model", work / "out"
    shutil.copytree(source, folder)
    rng = random.Random(args.seed)
    findings = 0
    for trial in range(args.trials):
        name = rng.choice(names)
        data, changes = damage(rng, originals[name])
        for n, original in originals.items():
            (folder / n).write_bytes(original)
        (folder / name).write_bytes(data)
        shutil.rmtree(out, ignore_errors=True)
        argv = (["generate", "--model", str(folder), "--prompt", "hi there", "--max-new-tokens", "3",
                 "--mode", rng.choice(["mtp", "greedy"])] if args.target == "driver"
                else ["rewrite", str(folder), str(out)])
        try:
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                status = cli(argv)
        except BaseException as e:  # noqa: BLE001  (what the fuzz looks for)
            findings += 1
            print("FINDING", trial, name, copy.deepcopy(changes), type(e).__name__, str(e)[:200])
            print(traceback.format_exc()[-700:])
            continue
        if status not in (0, 2):
            findings += 1
            print("FINDING", trial, name, changes, "exit status", status)
    shutil.rmtree(work, ignore_errors=True)
    print("findings", findings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
