"""ort_mtp::CopySlots's CUDA kernel (cases_copy_slots.py): in-place promotion, slot and whole copies,
150 tensors in one call, mixed dtypes and odd byte counts, and in place under ORT's CUDA graph; each
compared bit-exactly with ops.copy_slots.expected, in its own process."""

from __future__ import annotations

import pytest

from groups import COPY_SLOTS

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("group", [g.name for g in COPY_SLOTS])
def test_copy_slots_group(group, check_group):
    check_group(group)
