"""The ops under random cases (tests/op_fuzz.py): random shapes, element types, declared output
types, attributes, bound buffers and weights as initializers or graph inputs. Every case must either
equal the reference or, where a mutation breaks the op's contract, give ONNX Runtime's error; the
process must never crash. The cases run in a subprocess, so a crash fails this test and names the
case (rerun it alone with `python tests/op_fuzz.py --case N`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("op_fuzz.py")
OPS = ("CopySlots", "MatMulNBits", "GatedDeltaNet", "GroupQueryAttention", "GatedAttention", "MatMulNBitsPair",
       "SkipSimplifiedLayerNormalization")
CASES = 225 * len(OPS)  # case i runs op i % len(OPS)


@pytest.mark.parametrize("seed", [0, 1])
def test_random_cases_are_exact_or_an_error_never_a_crash(seed):
    result = subprocess.run([sys.executable, str(SCRIPT), "--provider", "cpu", "--cases", str(CASES),
                             "--seed", str(seed)], capture_output=True, text=True, timeout=600)
    lines = result.stdout.strip().splitlines()
    last = lines[-1] if lines else ""
    assert result.returncode in (0, 1), (
        f"the fuzz process died (status {result.returncode}) running {last[:2000]}\n{result.stderr[-2000:]}")
    failures = [line for line in lines if '"failure"' in line]
    assert not failures, "\n".join(failures[:10])
    summary = json.loads(last)["summary"]
    # Both outcomes of every op are exercised, so the cases test the checks and the kernels alike.
    for op in OPS:
        for outcome in ("ok", "error"):
            assert summary.get(f"{op} {outcome}", 0) >= CASES // len(OPS) // 4, summary
