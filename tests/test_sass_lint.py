"""bench/sass_lint.py, the device run's check of the built GPU code, on hand-written disassembly: a
stand-in cuobjdump prints it, so the whole command runs here without a GPU or a CUDA build."""

from __future__ import annotations

import importlib.util
import stat
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SASS = """
        Function : _ZN7ort_mtp4gemv15GemvTilesKernelI6__halfLi32ELi1EEEvNS0_12StreamParamsE
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   R2UR P0, UR9, R0 ;
        /*0020*/                   SYNCS.EXCH.64 URZ, [UR9+0x900], UR4 ;
        /*0030*/                   ULDC UR4, c[0x0][0x0] ;
        /*0040*/                   STL [R1], R10 ;
        /*0050*/                   LDL R15, [R1] ;
        /*0060*/                   EXIT ;
        Function : _ZN7ort_mtp4gemv16GemvStreamKernelI6__halfLi32ELi256ELi1ELb0EEEvNS0_12StreamParamsE
        /*0000*/                   ULDC.64 UR4, c[0x0][0x208] ;
        /*0010*/                   LDG.E R2, desc[UR4][R2.64] ;
        /*0020*/                   LDGSTS.E.BYPASS.128 [R7], desc[UR6][R4.64] ;
        /*0030*/                   EXIT ;
"""


def load_lint():
    spec = importlib.util.spec_from_file_location("sass_lint", REPO / "bench" / "sass_lint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_cuobjdump(tmp_path: Path) -> tuple[str, str]:
    listing = tmp_path / "listing.sass"
    listing.write_text(SASS)
    tool = tmp_path / "cuobjdump"
    tool.write_text(f"#!/bin/sh\ncat '{listing}'\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    library = tmp_path / "lib.so"
    library.write_bytes(b"")
    return str(tool), str(library)


def test_uniform_registers_and_local_memory_per_function():
    lint = load_lint()
    functions = lint.split_functions(SASS)
    tiles, stream = functions
    # R2UR names a predicate first: UR9 is written, so reading it is fine; UR4 is written by ULDC.
    assert lint.lint_function(functions[tiles]) == []
    # UR6 (the second descriptor) is read by the copy and written by nothing.
    problems = lint.lint_function(functions[stream])
    assert len(problems) == 1 and "UR6" in problems[0] and "LDGSTS" in problems[0]
    assert lint.local_memory(functions[tiles]) == 2
    assert lint.local_memory(functions[stream]) == 0


def test_unwritten_uniform_register_fails_and_local_memory_is_listed(tmp_path, capsys):
    lint = load_lint()
    tool, library = fake_cuobjdump(tmp_path)
    # The stream kernel's unwritten UR6 fails the check whatever --no-local says.
    assert lint.main([library, "--cuobjdump", tool]) == 1
    out = capsys.readouterr().out
    assert "1 with unwritten uniform registers, 1 with local memory" in out
    assert "GemvTilesKernel" in out and "2 local-memory instruction(s)" in out


def test_no_local_fails_only_for_the_kernels_it_names(tmp_path, capsys):
    lint = load_lint()
    tool, library = fake_cuobjdump(tmp_path)
    listing = Path(tool).parent / "listing.sass"
    listing.write_text(SASS.replace("desc[UR6]", "desc[UR4]"))  # every uniform register written now
    assert lint.main([library, "--cuobjdump", tool]) == 0
    assert lint.main([library, "--cuobjdump", tool, "--no-local", "GemvStreamKernel"]) == 0
    assert lint.main([library, "--cuobjdump", tool, "--no-local", r"GemvTilesKernelI6__halfLi32E"]) == 1
    assert "not allowed by --no-local" in capsys.readouterr().out
    assert lint.main([library, "--cuobjdump", tool, "--no-local", "("]) == 2
