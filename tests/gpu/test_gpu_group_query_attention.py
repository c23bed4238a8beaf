"""ort_mtp::GroupQueryAttention's CUDA kernel (cases_group_query_attention.py): against our CPU op within a
tolerance derived from the arithmetic, a width-S call bit-identical to S width-1 calls (every output row
and the cache), the shared past/present buffer, and a bad seqlens_k; in its own process."""

from __future__ import annotations

import pytest

from groups import GROUP_QUERY_ATTENTION

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("group", [g.name for g in GROUP_QUERY_ATTENTION])
def test_group_query_attention_group(group, check_group):
    check_group(group)
