"""What makes MTP equal greedy on CPU, measured: every op but attention computes the rows of a
verify forward bit-identically to width-1 decode steps, so a verify commits the decode steps' state
up to attention's rounding (exactly, when no attention layer precedes a linear-attention layer)."""

from __future__ import annotations

import numpy as np
import pytest

from driver import DriverError, Generator, identity
from driver.copy_slots import SlotPromoter
from driver.device import CpuDevice
from driver.folder import StateTensor, read_folder

PROMPT = list(range(3, 60, 4))
TOKENS = [176, 439, 342, 370, 93]


@pytest.fixture(scope="module")
def folder(tiny_folder):
    return read_folder(tiny_folder)


@pytest.mark.parametrize("width", [2, 4])
def test_verify_state_equals_decode_state_up_to_attention_rounding(folder, width):
    result = identity.rows(folder, PROMPT, TOKENS[:width], threads=1)
    # the tiny preset has attention at layers 3 and 7: layer 3's rounding reaches later layers' state
    assert result["kv_max_diff"] < 1e-5 and result["state_max_diff"] < 1e-5
    assert result["argmax_equal"] == [True] * width
    assert max(result["logits_max_diff"]) < 1e-4


@pytest.mark.parametrize("width", [2, 5])
def test_verify_commits_the_decode_state_exactly_when_attention_is_last(builder_folder, width):
    """The builder's folder has one attention layer, the last: nothing downstream of attention is
    state, so the KV rows and the Gated DeltaNet conv + recurrent states a verify commits are
    bit-identical to the decode steps' (LinearAttention and CausalConvWithState over T tokens equal
    T single-token calls)."""
    result = identity.rows(read_folder(builder_folder), PROMPT, TOKENS[:width], threads=1)
    assert result["kv_max_diff"] == 0.0
    assert result["state_max_diff"] == 0.0
    assert result["argmax_equal"] == [True] * width


def test_only_attention_rows_differ_with_our_matmul(folder):
    report = identity.per_op(folder, PROMPT, TOKENS[:4], threads=1)
    origins = {entry["op"] for entry in report if entry["origin"]}
    assert "MatMulNBits" not in origins  # ort_mtp::MatMulNBits: row i of M rows == the M=1 call
    assert origins <= {"GroupQueryAttention"}, origins
    for entry in report:
        assert entry["row_max_diff"] and max(entry["row_max_diff"]) < 1e-4


def test_windowed_folder_is_read_with_its_window(builder_windowed_folder):
    folder = read_folder(builder_windowed_folder)
    assert folder.main.state_window == 4
    conv = next(s for s in folder.main.recurrent if s.kind == "conv")
    recurrent = next(s for s in folder.main.recurrent if s.kind == "recurrent")
    assert conv.shape[:2] == (4, 1) and recurrent.shape[:2] == (4, 1)
    assert folder.mtp is not None and folder.mtp.state_window == 0
    with pytest.raises(DriverError, match="state_window=4.*--provider cuda"):
        Generator(folder, provider="cpu")


class _Runner:
    """The three things SlotPromoter reads from a GraphRunner: device, state specs, state buffers."""

    def __init__(self, window: int):
        self.device = CpuDevice()
        shapes = [("conv", (window, 1, 6, 3), np.float32), ("recurrent", (window, 1, 2, 4, 4), np.float16)]
        self.spec = type("Spec", (), {})()
        self.spec.recurrent = [StateTensor(kind, 0, f"past.{kind}", f"present.{kind}", shape, np.dtype(dtype))
                               for kind, shape, dtype in shapes]
        rng = np.random.default_rng(0)
        self.states = [tuple(rng.standard_normal(shape).astype(dtype) for _ in range(2)) for _, shape, dtype in shapes]
        self.parity = 0


@pytest.mark.parametrize("parity", [0, 1])
def test_slot_promotion_copies_one_slot_in_place(parity):
    runner = _Runner(window=4)
    runner.parity = parity
    before = [tuple(b.copy() for b in pair) for pair in runner.states]
    addresses = [tuple(b.ctypes.data for b in pair) for pair in runner.states]
    promoter = SlotPromoter(runner)
    promoter.promote(1, 3)
    for pair, old, where in zip(runner.states, before, addresses):
        assert tuple(b.ctypes.data for b in pair) == where  # same buffers: bound in place
        live, other = pair[parity], pair[1 - parity]
        np.testing.assert_array_equal(live[3], old[parity][1])  # slot 1 -> slot 3
        np.testing.assert_array_equal(live[:3], old[parity][:3])  # the rest untouched
        np.testing.assert_array_equal(other, old[1 - parity])  # the other buffer untouched
    assert promoter.copies == 1
