"""ort_mtp::GatedDeltaNet's CUDA kernel (cases_gated_delta_net.py): against our CPU op within a tolerance
derived from the arithmetic, a width-S call bit-identical to S width-1 calls (every y row and state
slot), present bound in place to past, and capture and replay under ORT's CUDA graph; in its own
process."""

from __future__ import annotations

import pytest

from groups import GATED_DELTA_NET

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("group", [g.name for g in GATED_DELTA_NET])
def test_gated_delta_net_group(group, check_group):
    check_group(group)
