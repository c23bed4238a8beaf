"""Instructions in the main loop of the GEMV kernels, from their machine code (no GPU needed): the
loop that holds the first `DEPBAR.LE SB0, 0x1` (cp.async.wait_group 1) and ends in the first backward
branch after it, with its instruction mix. lab/NOTES.md quotes these counts per 2 KB chunk and warp.

    python3 lab/sass_loop.py /tmp/ortmtp/libort_mtp_ops.so [--filter GemvTiles] [--cuobjdump PATH]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # bench/sass_lint.py, the product's check

from sass_lint import LintError, disassemble, find_cuobjdump, split_functions  # noqa: E402

WAIT = "DEPBAR"


def main_loop(instructions: list[tuple[str, str, str]]) -> list[tuple[str, str, str]] | None:
    """The instructions of the loop around the first wait on one outstanding cp.async group."""
    wait = next((i for i, (_, op, args) in enumerate(instructions) if op.startswith(WAIT) and "0x1" in args), None)
    if wait is None:
        return None
    address = [int(a, 16) for a, _, _ in instructions]
    for j in range(wait, len(instructions)):
        _, op, args = instructions[j]
        if op.startswith("BRA") and "0x" in args:
            target = int(args.split("0x")[1].split()[0], 16)
            if target <= address[wait]:
                start = address.index(target)
                return instructions[start:j + 1]
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", type=Path, help="a library, executable or cubin cuobjdump reads")
    ap.add_argument("--filter", default="Gemv", help="only functions whose mangled name contains this")
    ap.add_argument("--cuobjdump")
    args = ap.parse_args(argv)
    try:
        functions = split_functions(disassemble(args.file, find_cuobjdump(args.cuobjdump)))
    except LintError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, instructions in sorted(functions.items()):
        if args.filter not in name:
            continue
        loop = main_loop(instructions)
        if loop is None:
            continue
        mix = Counter(op.split(".")[0] for _, op, _ in loop).most_common(8)
        print(f"{len(loop):4d} {name[:100]}")
        print("     " + " ".join(f"{op}:{n}" for op, n in mix))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
