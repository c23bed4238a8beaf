"""ort_mtp::MatMulNBits's CUDA kernels: one test per group of groups.py (the checks themselves are in
cases_matmul.py), each group in its own process. The smoke groups are one per kernel path (tensor-core
with one and with several K-parts, layer-like cuts, the general kernel, the tiles layout); matmul
compares random cases with the float64 reference and our CPU op; decode checks that row i of an
M-row call is bit-identical to the M=1 call; graph checks capture and replay under ORT's CUDA graph."""

from __future__ import annotations

import pytest

from groups import MATMUL, PLAIN_LAUNCHES

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("group", [g.name for g in MATMUL])
def test_matmul_nbits_group(group, check_group):
    check_group(group)


@pytest.mark.parametrize("group", [g.name for g in PLAIN_LAUNCHES])
def test_matmul_nbits_plain_launch_group(group, check_group):
    """The same kernels with ORT_MTP_GEMV_PDL=0: plain launches instead of programmatic dependent launch."""
    check_group(group)
