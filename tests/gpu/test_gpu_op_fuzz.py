"""tests/op_fuzz.py's random cases of the library's ops on the CUDA EP (cases_fuzz.py), the seeds
tests/test_ops_fuzz.py runs on the CPU EP: every case equals the reference or, where a mutation breaks
the op's contract, gives ONNX Runtime's error; the process never crashes (a crash names the case)."""

from __future__ import annotations

import pytest

from cases_fuzz import CASES, OPS, OUTCOMES, outcome_counts
from groups import OP_FUZZ

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("group", [g.name for g in OP_FUZZ])
def test_op_fuzz_group(group, check_group):
    counts = outcome_counts(check_group(group).records)
    # Both outcomes of every op are exercised, so the cases test the checks and the kernels alike.
    for key in OUTCOMES:
        assert counts.get(key, 0) >= CASES // len(OPS) // 4, counts
