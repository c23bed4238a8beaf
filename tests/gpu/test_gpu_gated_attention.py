"""ort_mtp::GatedAttention's CUDA kernel (cases_gated_attention.py): against our CPU op within a tolerance
derived from the arithmetic, a width-S call bit-identical to S width-1 calls (every output row and the
cache), and a position past the cos/sin caches; in its own process."""

from __future__ import annotations

import pytest

from groups import GATED_ATTENTION

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("group", [g.name for g in GATED_ATTENTION])
def test_gated_attention_group(group, check_group):
    check_group(group)
