"""ort_mtp::MatMul's CUDA kernel (cases_float_matmul.py): against our CPU op within a tolerance derived from
the arithmetic, every row of an M-row call bit-identical to its 1-row call, and ORT's CUDA graph."""

from __future__ import annotations

import pytest

from groups import FLOAT_MATMUL

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("group", [g.name for g in FLOAT_MATMUL])
def test_float_matmul_group(group, check_group):
    check_group(group)
