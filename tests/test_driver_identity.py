"""What makes MTP equal greedy on CPU, measured: with the driver's rewrite every op computes the rows
of a verify forward bit-identically to width-1 decode steps, so a verify commits exactly the decode
steps' state. ONNX Runtime's own GroupQueryAttention (the attention rewrite off) is the one op whose
rows differ, and its rounding reaches the state where an attention layer precedes a linear-attention
layer when the activations are float32."""

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
def test_verify_rows_and_state_equal_decode_steps(folder, width):
    """The tiny preset has attention at layers 3 and 7, before linear-attention layers: with
    ort_mtp::GroupQueryAttention every logits row, the KV and the state are the decode steps' bits."""
    result = identity.rows(folder, PROMPT, TOKENS[:width], threads=1)
    assert result["logits_rows_equal"] == [True] * width and result["hidden_rows_equal"] == [True] * width
    assert result["kv_max_diff"] == 0.0 and result["state_max_diff"] == 0.0


@pytest.mark.parametrize("width", [2, 4])
def test_onnx_runtime_attention_rows_differ(folder, width):
    """Without the attention rewrite, ORT's GroupQueryAttention rounds a verify's rows differently (its
    GEMMs' accumulation depends on the width): the hidden rows differ from the decode steps'. The
    matmuls after it quantise their activations to int8 (accuracy_level 4), which absorbed the
    difference before the logits and the state here, but only where no value sits on a quantisation
    boundary: the gap the op closes by construction."""
    result = identity.rows(folder, PROMPT, TOKENS[:width], threads=1, rewrite=("matmul", "linear-attention"))
    assert not all(result["hidden_rows_equal"])
    assert result["kv_max_diff"] < 1e-5 and result["state_max_diff"] < 1e-5
    assert result["argmax_equal"] == [True] * width


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


def test_no_op_rows_differ_with_the_rewrite(folder, builder_folder):
    for f in (folder, read_folder(builder_folder)):
        report = identity.per_op(f, PROMPT, TOKENS[:4], threads=1)
        assert [entry["op"] for entry in report if entry["origin"]] == []


def test_only_onnx_runtime_attention_rows_differ_without_the_attention_rewrite(folder):
    report = identity.per_op(folder, PROMPT, TOKENS[:4], threads=1, rewrite=("matmul", "linear-attention"))
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
    # ORT's CPU kernels refuse the window: on the CPU only our GatedDeltaNet runs it.
    with pytest.raises(DriverError, match="state_window=4, which ONNX Runtime's CPU kernels refuse.*rewrite"):
        Generator(folder, provider="cpu", rewrite=False)
    with pytest.raises(DriverError, match="state_window=4.*rewrite"):
        Generator(folder, provider="cpu", rewrite=("matmul",))


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


def test_slot_promotion_reports_a_failed_copy():
    """A copy the library refuses (here a CUDA copy where the library has no GPU to run it, or no CUDA
    kernels) is a DriverError naming the slots, not a bare RuntimeError."""
    import ops

    if ops.visible_gpus():
        pytest.skip("needs a machine where a CUDA copy fails: no GPU")
    runner = _Runner(window=4)

    class HostBuffersAsCuda(CpuDevice):  # host buffers handed to the CUDA path: the library refuses them
        name = "cuda"
        stream = type("Stream", (), {"ptr": 0})()

    runner.device = HostBuffersAsCuda()
    promoter = SlotPromoter(runner)
    with pytest.raises(DriverError, match=r"promoting state slot 1 to slot 3 failed: "):
        promoter.promote(1, 3)
    assert promoter.copies == 0


def test_slot_promotion_refuses_a_slot_outside_the_window():
    promoter = SlotPromoter(_Runner(window=4))
    with pytest.raises(DriverError, match=r"slots \(4, 3\) out of range for a state of 4 slots"):
        promoter.promote(4, 3)
    assert promoter.copies == 0


def test_attention_before_linear_attention_commits_the_decode_state(builder_attention_first_folder):
    """The builder folder whose attention layer comes first: with ort_mtp::GroupQueryAttention a verify's
    hidden and logits rows and committed state are the decode steps' bits; with ORT's node (the
    attention rewrite off) its rows differ, and the hidden rows after it with them. (Whether that
    reaches the logits and the state depends on what follows: the builder's CPU matmuls quantise their
    activations to int8, accuracy_level 4, which can absorb a difference this small.)"""
    folder = read_folder(builder_attention_first_folder)
    ours = identity.rows(folder, PROMPT, TOKENS[:4], threads=1)
    assert ours["logits_rows_equal"] == [True] * 4 and ours["hidden_rows_equal"] == [True] * 4
    assert ours["state_max_diff"] == 0.0 and ours["kv_max_diff"] == 0.0
    theirs = identity.rows(folder, PROMPT, TOKENS[:4], threads=1, rewrite=("matmul", "linear-attention"))
    assert not all(theirs["hidden_rows_equal"])
