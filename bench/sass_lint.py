"""Static check of built GPU code for uniform registers that are read but never written.

    python bench/sass_lint.py /tmp/ortmtp/libort_mtp_ops.so          # any file cuobjdump reads
    python bench/sass_lint.py build.cubin --cuobjdump /path/to/cuobjdump

Why: the first device run (fixed in commit bee2231) died with error 715 ("an illegal instruction was encountered") in every call of the
tensor-core MatMulNBits kernel. ptxas 13.0 compiled `cp.async ... .L2::cache_hint` (with a createpolicy
policy) for sm_90 into an LDGSTS whose memory descriptor `desc[URn]` names uniform registers that no
instruction of the kernel writes; the GPU rejects the garbage descriptor. This script lists, per kernel,
every uniform register (URn) read by an instruction but written by none, and every `desc[URn]` whose
64-bit pair (URn, URn+1) is not written. Exit status 1 when any is found, 0 when none, 2 on a bad call.

It also lists every function that touches local memory (STL/LDL: a stack frame, spilled registers).
For the GEMV kernels that is a cost even when the spill sits outside the main loop: an 8-byte frame
(one spill before the loop, one reload after it) made the tiles kernel 6% slower on the chain
(docs/kernels.md#multi-token-kernels). Functions whose name matches --no-local (a regular expression) fail the check (exit 1)
when they touch local memory; the others are listed only.

It disassembles with cuobjdump (--cuobjdump, else $CUDA_HOME/bin, PATH, /usr/local/cuda/bin). Uniform registers are
written only by instructions that name them first (ULDC, UMOV, S2UR, R2UR, ...); no register holds a
value at kernel entry, so a read with no writer anywhere in the function is a miscompile (or dead code
the compiler left behind; the report names the instruction so it can be judged).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\s*(.*?)\s*;")
UR = re.compile(r"\bUR(\d+)\b")
DESC = re.compile(r"desc\[UR(\d+)\]")
PAIR_SUFFIX = (".64", ".WIDE")  # instructions whose uniform destination is a register pair


class LintError(RuntimeError):
    pass


def find_cuobjdump(explicit: str | None) -> str:
    candidates = [explicit] if explicit else []
    if os.environ.get("CUDA_HOME"):
        candidates.append(str(Path(os.environ["CUDA_HOME"]) / "bin" / "cuobjdump"))
    candidates.append(shutil.which("cuobjdump") or "")
    candidates.append("/usr/local/cuda/bin/cuobjdump")
    for c in candidates:
        if c and Path(c).is_file():
            return c
    raise LintError("cuobjdump not found: pass --cuobjdump PATH or put it on PATH")


def disassemble(path: Path, cuobjdump: str) -> str:
    if not path.is_file():
        raise LintError(f"{path}: no such file")
    proc = subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise LintError(f"cuobjdump -sass {path} failed: {proc.stderr.strip()[:300]}")
    return proc.stdout


def split_functions(sass: str) -> dict[str, list[tuple[str, str, str]]]:
    """function name -> [(address, opcode, operands)]. The same name may occur for several
    architectures in one file; their instructions are kept apart by a suffix."""
    functions: dict[str, list[tuple[str, str, str]]] = {}
    current = None
    for line in sass.splitlines():
        m = FUNCTION.match(line)
        if m:
            name, k = m.group(1), 1
            while (f"{name}#{k}" if k > 1 else name) in functions:
                k += 1
            current = f"{name}#{k}" if k > 1 else name
            functions[current] = []
            continue
        m = INSTRUCTION.match(line)
        if m and current is not None:
            functions[current].append((m.group(1), m.group(2), m.group(3)))
    return functions


def lint_function(instructions: list[tuple[str, str, str]]) -> list[str]:
    written: set[int] = set()
    for _, opcode, operands in instructions:
        parts = [x.strip() for x in operands.split(",")]
        # A predicate may come first (R2UR P0, UR9, R0 writes both P0 and UR9).
        first = parts[1] if len(parts) > 1 and re.fullmatch(r"U?P(\d+|T)", parts[0]) else parts[0]
        m = re.fullmatch(r"UR(\d+)", first)
        if m:
            n = int(m.group(1))
            written.add(n)
            if opcode.endswith(PAIR_SUFFIX) or any(s + "." in opcode + "." for s in PAIR_SUFFIX):
                written.add(n + 1)
    problems = []
    for address, opcode, operands in instructions:
        parts = operands.split(",")
        skip = 2 if len(parts) > 2 and re.fullmatch(r"U?P(\d+|T)", parts[0].strip()) else 1
        dest = parts[skip - 1].strip()
        reads = ",".join(parts[skip:]) if re.fullmatch(r"UR\d+", dest) else operands
        missing = sorted({int(n) for n in UR.findall(reads)} - written)
        for n in DESC.findall(operands):
            missing += [r for r in (int(n), int(n) + 1) if r not in written and r not in missing]
        if missing:
            regs = ", ".join(f"UR{r}" for r in sorted(set(missing)))
            problems.append(f"/*{address}*/ {opcode} {operands}: reads {regs}, which nothing writes")
    return problems


LOCAL_MEMORY = ("STL", "LDL")


def local_memory(instructions: list[tuple[str, str, str]]) -> int:
    """How many instructions of the function store to or load from local memory."""
    return sum(1 for _, opcode, _ in instructions if opcode.split(".")[0] in LOCAL_MEMORY)


def lint(sass: str) -> dict[str, list[str]]:
    return {name: p for name, ins in split_functions(sass).items() if (p := lint_function(ins))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="shared library, object file or cubin")
    parser.add_argument("--cuobjdump", help="path of cuobjdump")
    parser.add_argument("--no-local", metavar="REGEX", help="fail when a function matching REGEX uses local memory")
    args = parser.parse_args(argv)
    try:
        no_local = re.compile(args.no_local) if args.no_local else None
    except re.error as e:
        print(f"sass_lint: --no-local {args.no_local!r}: {e}", file=sys.stderr)
        return 2
    try:
        tool = find_cuobjdump(args.cuobjdump)
        bad = 0
        for f in args.files:
            sass = disassemble(Path(f), tool)
            functions = split_functions(sass)
            if not functions:
                raise LintError(f"{f}: cuobjdump listed no GPU functions")
            report = lint(sass)
            for name, problems in report.items():
                bad += 1
                print(f"{f}: {name}: {len(problems)} instruction(s) read unwritten uniform registers")
                for p in problems[:5]:
                    print(f"    {p}")
            spilled = {name: n for name, ins in functions.items() if (n := local_memory(ins))}
            for name, n in sorted(spilled.items()):
                fatal = bool(no_local and no_local.search(name))
                bad += fatal
                print(f"{f}: {name}: {n} local-memory instruction(s){' (not allowed by --no-local)' if fatal else ''}")
            print(f"sass_lint {f}: {len(functions)} functions, {len(report)} with unwritten uniform registers, "
                  f"{len(spilled)} with local memory")
        return 1 if bad else 0
    except LintError as e:
        print(f"sass_lint: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
