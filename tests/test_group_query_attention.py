"""ort_mtp::GroupQueryAttention on the CPU EP: against its float64 reference, against ONNX Runtime's
com.microsoft::GroupQueryAttention (the node it replaces), a width-S call bit-identical to S width-1
calls (output rows and the KV cache), the shared past/present buffer, and its errors, each naming the
node. The CPU EP attends with the float32 kernel by default (group_query_attention_cpu_fast.cc) and the
double reference kernel with ORT_MTP_CPU_KERNEL=reference (read once per process):
test_reference_kernel_passes_this_module reruns the arithmetic tests here in a process that picks it.

Tolerances (u_T the unit roundoff: 2^-24 float32, 2^-11 float16), L the positions a row sees:
  - reference: the reference kernel computes in double and rounds each score to float32 (as ORT's float
    scores) and the output to T; the float64 reference keeps float64 scores, whose difference (~u_32 of a
    score, times the score's size) moves a softmax weight by about as much: 16 u_32 of max |output| in
    float32; in float16 the output's own rounding, 1 ulp of each element (u_16 |out|) plus that. The
    float32 kernel sums H products per score and L terms per softmax sum and output in float32 too: ~(H +
    L) u_32 more (relative to max |output|), which the cases of few positions keep under the same bound
    and test_long_rows_match_reference states as such.
  - ORT: float32 GEMMs and softmax, ~(H + L) u_32 relative; float16: ORT also rounds its output to fp16,
    so at most one fp16 rounding apart: 2 u_16 |out|. The KV cache is a copy: bit-equal.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import onnxruntime as ort
import pytest

import ops.group_query_attention as gqa
from ops.group_query_attention import OUTPUTS, GqaConfig
from ops.nbits import UNIT_ROUNDOFF

NODE = "/model/layers.3/attn/GroupQueryAttention"
LABEL = f"GroupQueryAttention node '{NODE}'"
U = UNIT_ROUNDOFF
REFERENCE_KERNEL = os.environ.get("ORT_MTP_CPU_KERNEL") == "reference"


class Op:
    def __init__(self, cpu_session, cfg: GqaConfig, domain: str = "ort_mtp", attributes=None, threads: int = 0,
                 loose: bool = False):
        model = gqa.model(cfg, domain=domain, node_name=NODE, attributes=attributes, symbolic=loose)
        if threads:
            options = ort.SessionOptions()
            options.log_severity_level = 3
            options.intra_op_num_threads = threads
            import ops
            options.register_custom_ops_library(ops.library_path())
            self.session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        else:
            self.session = cpu_session(model)

    def __call__(self, feeds) -> dict[str, np.ndarray]:
        return dict(zip(OUTPUTS, self.session.run(None, feeds)))


CASES = [  # (num_heads, kv_num_heads, head_size, seq, past, buffer, extra config)
    (4, 2, 16, 1, 7, 24, {}),
    (4, 2, 16, 4, 7, 24, {}),
    (8, 1, 32, 16, 5, 24, {}),
    (2, 2, 64, 9, 0, 9, {}),  # a first prompt filling its buffer
    (4, 4, 16, 40, 0, 64, {}),  # a prefill chunk
    (4, 2, 16, 3, 10, 16, {"local_window_size": 4}),
    (4, 2, 16, 5, 6, 16, {"softcap": 3.0, "scale": 0.3}),
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("nq,nkv,h,seq,past,buffer,extra", CASES)
def test_matches_reference_and_onnx_runtime(nq, nkv, h, seq, past, buffer, extra, dtype, cpu_session):
    cfg = GqaConfig(nq, nkv, h, dtype=dtype, **extra)
    rng = np.random.default_rng(nq * 100 + seq * 7 + past)
    batch = 2 if seq == 1 or past == 0 else 1  # ORT takes one batch row for a later chunk of several tokens
    feeds = gqa.random_case(rng, cfg, batch=batch, seq=seq, past=past, buffer=buffer)
    ours = Op(cpu_session, cfg)(feeds)
    theirs = Op(cpu_session, cfg, domain="com.microsoft")(feeds)
    out, pk, pv = gqa.reference(cfg, **feeds)
    got = ours["output"].astype(np.float64)
    u = U[dtype]
    scale = np.abs(out).max()
    if dtype == "float32":
        assert np.abs(got - out).max() <= 16 * u * scale
    else:
        assert np.all(np.abs(got - out) <= u * np.abs(out) + 16 * U["float32"] * scale)
    assert np.all(np.abs(got - theirs["output"].astype(np.float64)) <= 2 * u * np.abs(out) + (h + past + seq) * U["float32"] * scale)
    for name, want in (("present_key", pk), ("present_value", pv)):
        assert ours[name].tobytes() == theirs[name].tobytes(), name
        assert np.array_equal(ours[name].astype(np.float64), want), name


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("past,extra", [(700, {}), (300, {"local_window_size": 200, "softcap": 30.0})])
def test_long_rows_match_reference(past, extra, dtype, cpu_session):
    """Rows that see hundreds of positions at Qwen3.5's head size (every lane and fold of the float32
    kernel's sums in use): within (H + L) u_32 of max |output| of the float64 reference (plus the
    output's own rounding in float16), and the reference kernel within that too."""
    cfg = GqaConfig(8, 2, 128, dtype=dtype, **extra)
    seq = 3
    feeds = gqa.random_case(np.random.default_rng(past), cfg, batch=1, seq=seq, past=past, buffer=past + seq + 5)
    out = gqa.reference(cfg, **feeds)[0]
    got = Op(cpu_session, cfg)(feeds)["output"].astype(np.float64)
    scale = np.abs(out).max()
    bound = (cfg.head_size + past + seq) * U["float32"] * scale + (U[dtype] * np.abs(out) if dtype == "float16" else 0)
    assert np.all(np.abs(got - out) <= bound), np.max(np.abs(got - out) / bound)


@pytest.mark.skipif(REFERENCE_KERNEL, reason="this process runs the reference kernel already")
def test_reference_kernel_passes_this_module(rerun_on_reference_kernels):
    """ORT_MTP_CPU_KERNEL=reference (read once per process) runs the double reference attention: this
    module's arithmetic tests, rerun in a process that picks it, hold it to the same bounds and width and
    thread-count identities."""
    rerun_on_reference_kernels(__file__, "matches_reference or long_rows or width_s or present_bound or past_the_call")


def test_positions_past_the_call_are_zero_and_never_read(cpu_session):
    """present (not past's buffer) has past's first positions, the new ones, then zeros; what past's
    buffer held beyond its first `past` positions does not change the output."""
    cfg = GqaConfig()
    feeds = gqa.random_case(np.random.default_rng(3), cfg, batch=1, seq=2, past=4, buffer=10)
    op = Op(cpu_session, cfg)
    first = op(feeds)
    assert not first["present_key"][:, :, 6:].any() and not first["present_value"][:, :, 6:].any()
    garbage = {**feeds, "past_key": feeds["past_key"].copy(), "past_value": feeds["past_value"].copy()}
    garbage["past_key"][:, :, 4:] = 1e4
    garbage["past_value"][:, :, 4:] = np.nan
    second = op(garbage)
    assert all(first[k].tobytes() == second[k].tobytes() for k in OUTPUTS)


WIDTH_CASES = [(4, 2, 16, 8, 3, "float32", {}), (8, 1, 32, 16, 0, "float32", {}), (4, 2, 16, 6, 9, "float16", {}),
               (4, 2, 16, 7, 2, "float32", {"local_window_size": 3, "softcap": 2.0}),
               (8, 2, 128, 5, 90, "float32", {})]  # rows of ~90 positions: every lane of the float32 sums


@pytest.mark.parametrize("nq,nkv,h,seq,past,dtype,extra", WIDTH_CASES)
def test_width_s_equals_s_width_1_calls(nq, nkv, h, seq, past, dtype, extra, cpu_session):
    """Query row s of a width-S call and the KV cache after it are the same bytes as the width-1 call
    at that position from the cache the earlier rows left (and the same with 1 or 2 threads): what
    makes an MTP verify print greedy's tokens."""
    cfg = GqaConfig(nq, nkv, h, dtype=dtype, **extra)
    buffer = past + seq + 3
    feeds = gqa.random_case(np.random.default_rng(seq * 31 + past), cfg, batch=1, seq=seq, past=past, buffer=buffer)
    op = Op(cpu_session, cfg)
    wide = op(feeds)
    one_thread = Op(cpu_session, cfg, threads=1)(feeds)
    assert all(wide[k].tobytes() == one_thread[k].tobytes() for k in OUTPUTS)
    cache = {"past_key": feeds["past_key"], "past_value": feeds["past_value"]}
    for s in range(seq):
        step = {"query": feeds["query"][:, s:s + 1], "key": feeds["key"][:, s:s + 1], "value": feeds["value"][:, s:s + 1],
                **cache, "seqlens_k": np.array([past + s], np.int32),
                "total_sequence_length": np.array(past + s + 1, np.int32)}
        out = op(step)
        assert out["output"].tobytes() == wide["output"][:, s:s + 1].tobytes(), f"row {s}"
        cache = {"past_key": out["present_key"], "past_value": out["present_value"]}
    assert cache["past_key"][:, :, :past + seq].tobytes() == wide["present_key"][:, :, :past + seq].tobytes()
    assert cache["past_value"][:, :, :past + seq].tobytes() == wide["present_value"][:, :, :past + seq].tobytes()


def test_present_bound_to_past_buffers(cpu_session):
    """The driver's shared KV buffer: present bound by IOBinding to past's own buffers (max_length long).
    The op writes the new positions in place and leaves every other position as it was."""
    cfg = GqaConfig()
    feeds = gqa.random_case(np.random.default_rng(5), cfg, batch=2, seq=3, past=6, buffer=12)
    op = Op(cpu_session, cfg)
    want = op(feeds)
    arrays = {k: v.copy() for k, v in feeds.items()}  # kept alive: the OrtValues use their memory
    values = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in arrays.items()}
    binding = op.session.io_binding()
    for name, value in values.items():
        binding.bind_ortvalue_input(name, value)
    binding.bind_output("output")
    binding.bind_ortvalue_output("present_key", values["past_key"])
    binding.bind_ortvalue_output("present_value", values["past_value"])
    op.session.run_with_iobinding(binding)
    assert binding.get_outputs()[0].numpy().tobytes() == want["output"].tobytes()
    for past, present in (("past_key", "present_key"), ("past_value", "present_value")):
        shared = values[past].numpy()
        assert shared[:, :, :9].tobytes() == want[present][:, :, :9].tobytes()
        assert shared[:, :, 9:].tobytes() == feeds[past][:, :, 9:].tobytes()  # untouched, not zeroed


# ------------------------------------------------------------------------------------------------
# Errors: every one an ORT error naming the node, and the session stays usable


def _error(run) -> str:
    with pytest.raises(Exception) as info:
        run()
    text = str(info.value)
    assert LABEL in text, text
    return text


@pytest.mark.parametrize("attributes,expected", [
    ({"num_heads": 4}, "missing required int attribute 'kv_num_heads'"),
    ({"num_heads": 4, "kv_num_heads": 3}, "must be a multiple of kv_num_heads"),
    ({"num_heads": 4, "kv_num_heads": 2, "scale": 1}, "attribute 'scale' must be a float"),
    ({"num_heads": 4, "kv_num_heads": 2, "do_rotary": 1}, "do_rotary=1 is not supported"),
    ({"num_heads": 4, "kv_num_heads": 2, "local_window_size": 0}, "local_window_size must be -1"),
    ({"num_heads": 4, "kv_num_heads": 2, "softcap": -1.0}, "softcap must be finite and >= 0"),
])
def test_bad_attributes_fail_at_session_creation(attributes, expected, cpu_session):
    assert expected in _error(lambda: Op(cpu_session, GqaConfig(), attributes=attributes))


def _feeds(**replace):
    feeds = gqa.random_case(np.random.default_rng(0), GqaConfig(), batch=1, seq=2, past=3, buffer=8)
    feeds.update(replace)
    return feeds


@pytest.mark.parametrize("replace,expected", [
    ({"seqlens_k": np.array([0], np.int32)}, "the total length) must be at least S"),
    ({"seqlens_k": np.array([-5], np.int32)}, "must be at least S"),
    ({"seqlens_k": np.array([40], np.int32)}, "past the end of the KV cache (length 8)"),
    ({"seqlens_k": np.array([2**31 - 1], np.int32)}, "past the end of the KV cache"),
    ({"seqlens_k": np.array([4, 4], np.int32)}, "input seqlens_k has shape [2], expected [B]"),
    ({"total_sequence_length": np.array(0, np.int32)}, "total_sequence_length must be >= 1"),
    ({"total_sequence_length": np.array([5, 5], np.int32)}, "must hold one value"),
    ({"key": np.zeros((1, 2, 16), np.float32)}, "input key has shape [1, 2, 16]"),
    ({"past_value": np.zeros((1, 2, 7, 16), np.float32)}, "input past_value has shape [1, 2, 7, 16]"),
    ({"query": np.zeros((1, 0, 64), np.float32), "key": np.zeros((1, 0, 32), np.float32),
      "value": np.zeros((1, 0, 32), np.float32)}, "a call needs at least 1 token"),
])
def test_bad_inputs_fail_at_run(replace, expected, cpu_session):
    op = Op(cpu_session, GqaConfig(), loose=True)
    assert expected in _error(lambda: op(_feeds(**replace)))
    op(_feeds())  # still usable


def test_past_longer_than_its_buffer_is_refused(cpu_session):
    """Not sharing past's buffer, the op copies past's first past_b positions: they must exist."""
    op = Op(cpu_session, GqaConfig())
    feeds = _feeds(seqlens_k=np.array([10], np.int32), total_sequence_length=np.array(12, np.int32))
    assert "asks for 9 past positions but past_key holds 8" in _error(lambda: op(feeds))


def test_input_type_without_a_kernel_names_the_op(cpu_session):
    cfg = dataclasses.replace(GqaConfig(), dtype="float32")
    model = gqa.model(cfg, node_name=NODE)
    model.graph.input[5].type.tensor_type.elem_type = 7  # seqlens_k as int64
    with pytest.raises(Exception) as info:
        cpu_session(model)
    assert "GroupQueryAttention" in str(info.value)


def test_empty_batch(cpu_session):
    feeds = gqa.random_case(np.random.default_rng(1), GqaConfig(), batch=0, seq=2, past=1, buffer=4)
    out = Op(cpu_session, GqaConfig())(feeds)
    assert out["output"].shape == (0, 2, 64) and out["present_key"].shape == (0, 2, 4, 16)
