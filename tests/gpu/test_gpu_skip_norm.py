"""ort_mtp::SkipSimplifiedLayerNormalization's CUDA kernel (cases_skip_norm.py): against our CPU op within
a tolerance derived from the arithmetic, every row of an M-row call bit-identical to its 1-row call, and
ORT's CUDA graph (the kernel is launched with programmatic dependent launch on sm_90)."""

from __future__ import annotations

import pytest

from groups import SKIP_NORM

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("group", [g.name for g in SKIP_NORM])
def test_skip_norm_group(group, check_group):
    check_group(group)
