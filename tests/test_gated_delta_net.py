"""ort_mtp::GatedDeltaNet on the CPU EP: against its float64 reference (ops.gated_delta_net, itself
checked against Hugging Face's Qwen3.5 code), against ONNX Runtime's own com.microsoft subgraph, a width
S call bit-identical to S width-1 calls (outputs, states, window slots), and its errors, each naming
the node. The CPU EP runs the float32 kernel by default (gated_delta_net_cpu_fast.cc) and the double
reference kernel with ORT_MTP_CPU_KERNEL=reference (read once per process):
test_reference_kernel_passes_this_module reruns the arithmetic tests here in a process that picks it.

Tolerances, u_T the unit roundoff of T (2^-24 float32, 2^-11 float16, 2^-8 bfloat16):
  - against the float64 reference, the reference kernel: the two compute in double and round at the
    same points, so they differ only where two doubles ~1e-16 apart straddle a rounding boundary of T:
    that value is off by 1 ulp and perturbs what follows by about as much. Allowed: 4 u_T |ref| + 4 u_T
    rms(ref), and at least 99% of the elements bit-equal (a rounding point missing or added would
    break that).
  - against the float64 reference, the float32 kernel: the bound of ORT's subgraph below (both
    accumulate in float32); and in a 16-bit tensor at least 99% of the elements bit-equal, since the
    float32 kernel rounds at the reference's points and float32's own error (2^-13 of a float16 ulp)
    rarely reaches a rounding boundary of T (a rounding point missing or added would break that).
  - ORT's subgraph: ORT accumulates in float32, so each token's state and output carry ~(2 dk + K +
    8) u_32 of relative error, and the state carries it on: ~S (2 dk + K + 8) u_32 after S tokens
    (relative to the tensor's largest element). float16 adds a flip of an fp16 rounding per token at
    most, and ORT's wide call keeps its state in float between tokens where the op rounds it (that is
    the point of the op): (8 + 2 S) u_16. The conv states are copies: bit-equal.
"""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest

import ops.gated_delta_net as gdn
from ops.gated_delta_net import OUTPUTS, GdnConfig
from ops.nbits import UNIT_ROUNDOFF

NODE = "/model/layers.0/linear_attn/GatedDeltaNet"
REFERENCE_KERNEL = os.environ.get("ORT_MTP_CPU_KERNEL") == "reference"
LABEL = f"GatedDeltaNet node '{NODE}'"


def _session(cpu_session, model, threads: int = 0):
    if not threads:
        return cpu_session(model)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    from ops import library_path
    options.register_custom_ops_library(library_path())
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


class Op:
    """One session of the one-node model for cfg and w (weights as initializers)."""

    def __init__(self, cpu_session, cfg: GdnConfig, w, threads: int = 0):
        self.cfg, self.float32_io = cfg, cfg.dtype == "bfloat16" or cfg.recurrent_dtype == "bfloat16"
        model = gdn.gated_delta_net_model(cfg, w, node_name=NODE, float32_io=self.float32_io)
        self.session = _session(cpu_session, model, threads)

    def __call__(self, inputs) -> dict[str, np.ndarray]:
        feeds = gdn.feeds(inputs, self.cfg, float32_io=self.float32_io)
        return {name: np.asarray(v, np.float32) for name, v in zip(OUTPUTS, self.session.run(None, feeds))}


def _case(seed, cfg, batch, seq, conv_bias=True):
    rng = np.random.default_rng(seed)
    return gdn.random_weights(rng, cfg, conv_bias=conv_bias), gdn.random_inputs(rng, cfg, batch, seq)


# (Hk, Hv, dk, dv, S, state_window, T, state type); K = 4 throughout, as Qwen3.5's.
CASES = [
    (2, 4, 8, 8, 1, 0, "float32", None),
    (2, 4, 8, 16, 5, 0, "float32", None),
    (2, 2, 16, 8, 16, 0, "float32", None),
    (1, 4, 8, 8, 37, 0, "float32", None),    # a prefill chunk
    (2, 4, 128, 128, 3, 0, "float32", None),  # Qwen3.5's head dims
    (2, 4, 64, 64, 4, 3, "float32", None),    # the small preset's (the CPU kernel's other fixed-size form)
    (2, 4, 8, 8, 3, 4, "float32", None),      # fewer tokens than slots
    (2, 4, 8, 8, 9, 4, "float32", None),
    (2, 4, 16, 8, 7, 0, "float16", None),
    (2, 2, 8, 8, 37, 0, "float16", None),
    (1, 2, 8, 8, 2, 4, "float16", None),
    (2, 4, 8, 8, 6, 3, "float16", "float32"),  # a float32 state beside float16 activations
    (2, 4, 8, 8, 5, 0, "bfloat16", None),
    (2, 4, 8, 16, 11, 4, "bfloat16", None),
]


def _config(hk, hv, dk, dv, window, dtype, state_dtype, **kw):
    return GdnConfig(hk, hv, dk, dv, state_window=window, dtype=dtype, state_dtype=state_dtype, **kw)


def _assert_close_to_reference(got, want, cfg, seq, name):
    """The op's output `name` against the float64 reference's (bounds: the module docstring)."""
    tensor_type = cfg.recurrent_dtype if name == "present_recurrent" else cfg.dtype
    got, want = got.astype(np.float64), want.astype(np.float64)
    equal = np.mean(got == want) if want.size else 1.0
    if REFERENCE_KERNEL:
        u = UNIT_ROUNDOFF[cfg.dtype]
        rms = np.sqrt(np.mean(want**2)) if want.size else 0.0
        err = np.abs(got - want)
        bound = 4 * u * np.abs(want) + 4 * u * rms
        assert np.all(err <= bound), f"{name}: max error {err.max():.3g}, worst ratio {np.max(err / bound):.3g}"
        assert equal >= 0.99, f"{name}: only {equal:.4f} of the elements bit-equal"
        return
    _assert_close_to_ort(got, want, _ort_tolerance(cfg, seq), name)
    if tensor_type != "float32":
        assert equal >= 0.99, f"{name} ({tensor_type}): only {equal:.4f} of the elements bit-equal"


@pytest.mark.parametrize("hk,hv,dk,dv,seq,window,dtype,state_dtype", CASES)
def test_matches_reference(hk, hv, dk, dv, seq, window, dtype, state_dtype, cpu_session):
    cfg = _config(hk, hv, dk, dv, window, dtype, state_dtype)
    w, inputs = _case(seq + 7 * dk, cfg, batch=2, seq=seq, conv_bias=seq % 2 == 1)
    got = Op(cpu_session, cfg, w)(inputs)
    want = gdn.reference(cfg, w, inputs)
    for name in OUTPUTS:
        _assert_close_to_reference(got[name], want[name], cfg, seq, name)


def test_y_magnitude_bounds_the_float32_error_where_the_state_product_cancels(cpu_session):
    """reference(..., magnitudes=True)'s y_magnitude: a case found by tests/op_fuzz.py (seed 102) where
    token 0's o_j = sum_i S_ij q_i is ~250 times smaller than the sum of its terms' sizes, so the float32
    kernel's few roundings of those terms are ~4e-5 of y_j, past a bound on |y| and y's rms alone; within
    a few roundings of y_magnitude."""
    cfg = GdnConfig(1, 2, 4, 16, conv_kernel=2, dtype="float32")
    w, inputs = _case(443696294, cfg, batch=2, seq=3)
    got = Op(cpu_session, cfg, w)(inputs)["y"].astype(np.float64)
    want = gdn.reference(cfg, w, inputs, magnitudes=True)
    ref, magnitude = want["y"].astype(np.float64), want["y_magnitude"]
    err, u = np.abs(got - ref), 2.0**-24
    rms = np.sqrt(np.mean(ref**2))
    assert np.max(err / (u * (np.abs(ref) + rms))) > 72  # no bound on the values alone holds here
    assert np.all(err <= 16 * u * (magnitude + np.abs(ref)))
    assert magnitude.max() > 10 * np.abs(ref).max()  # the cancellation is what the magnitude sees


def test_attributes_reach_the_arithmetic(cpu_session):
    """scale, epsilon and l2norm_epsilon as given (HF's l2norm epsilon, a large RMS epsilon)."""
    cfg = GdnConfig(2, 4, 8, 8, scale=0.3, epsilon=0.5, l2norm_epsilon=1e-6)
    w, inputs = _case(5, cfg, batch=1, seq=4)
    got, want = Op(cpu_session, cfg, w)(inputs), gdn.reference(cfg, w, inputs)
    default = gdn.reference(GdnConfig(2, 4, 8, 8), w, inputs)
    _assert_close_to_reference(got["y"], want["y"], cfg, 4, "y")
    assert np.abs(got["y"] - default["y"]).max() > 1e-3  # the attributes did change the result


def test_reference_is_hugging_face_qwen3_5():
    """ops.gated_delta_net.reference (float32 roundings, HF's l2norm epsilon and unrounded q scale)
    against transformers' own Qwen3.5 functions in float64: the conv state's order, the head
    mapping (repeat_interleave), the gates, the recurrence and the gated norm."""
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    hk, hv, dk, dv, K, B, S = 2, 4, 8, 16, 4, 2, 6
    cfg = GdnConfig(hk, hv, dk, dv, scale=float(1 / np.sqrt(dk)), epsilon=1e-6, l2norm_epsilon=1e-6)
    w, inputs = _case(11, cfg, batch=B, seq=S)
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in {**inputs, **w.arrays()}.items()}
    conv_state = t["past_conv"].clone()
    mixed = modeling.causal_conv1d_update(t["qkv"].transpose(1, 2), conv_state, t["conv_weight"][:, 0, :],
                                          t["conv_bias"], "silu").transpose(1, 2)
    kd = cfg.key_dim
    q = mixed[..., :kd].reshape(B, S, hk, dk)
    k = mixed[..., kd:2 * kd].reshape(B, S, hk, dk)
    v = mixed[..., 2 * kd:].reshape(B, S, hv, dv)
    beta = t["b"].sigmoid()
    g = t["neg_exp_A"] * torch.nn.functional.softplus(t["a"] + t["dt_bias"])
    o, state = modeling.torch_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=t["past_recurrent"],
                                                         output_final_state=True, use_qk_l2norm_in_kernel=True)
    norm = modeling.Qwen3_5RMSNormGated(dv, eps=1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(t["norm_weight"])
        y = norm(o.reshape(-1, dv), t["z"].reshape(-1, dv)).reshape(B, S, hv * dv)
    want = gdn.reference(cfg, w, inputs)
    for name, hf in (("y", y), ("present_conv", conv_state), ("present_recurrent", state)):
        hf = hf.detach().numpy()
        # float32 roundings of the reference, carried through S tokens
        assert np.abs(want[name] - hf).max() <= 1e-5 * max(1.0, np.abs(hf).max()), name


@pytest.mark.skipif(REFERENCE_KERNEL, reason="this process runs the reference kernel already")
def test_reference_kernel_passes_this_module(rerun_on_reference_kernels):
    """ORT_MTP_CPU_KERNEL=reference (read once per process) runs the double reference kernel: this
    module's arithmetic tests, rerun in a process that picks it, hold it to its own, stricter bound
    against the float64 reference, and to the same width and thread-count identities."""
    rerun_on_reference_kernels(__file__, "matches_reference or attributes_reach or matches_ort or window_slots or width_s or present_bound")


# ------------------------------------------------------------------------------------------------
# Against ONNX Runtime's own subgraph (CPU EP: float32 and float16, no state window)

def _ort_tolerance(cfg, seq):
    if cfg.dtype == "float32":
        return seq * (2 * cfg.k_head_dim + cfg.conv_kernel + 8) * UNIT_ROUNDOFF["float32"]
    return (8 + 2 * seq) * UNIT_ROUNDOFF["float16"]


def _assert_close_to_ort(got, want, tol, what):
    err = np.abs(got.astype(np.float64) - want.astype(np.float64)).max()
    scale = max(np.abs(want).max(), 1e-30)
    assert err <= tol * scale, f"{what}: max error {err:.3g} = {err / scale:.3g} of max |ORT|, allowed {tol:.3g}"


def _ort(cpu_session, cfg, w):
    session = cpu_session(gdn.ort_subgraph_model(cfg, w), register=False)
    return lambda inputs: dict(zip(OUTPUTS, session.run(None, gdn.feeds(inputs, cfg))))


ORT_CASES = [c for c in CASES if c[5] == 0 and c[6] != "bfloat16"]


@pytest.mark.parametrize("hk,hv,dk,dv,seq,window,dtype,state_dtype", ORT_CASES)
def test_matches_ort_subgraph(hk, hv, dk, dv, seq, window, dtype, state_dtype, cpu_session):
    cfg = _config(hk, hv, dk, dv, window, dtype, state_dtype, scale=None, epsilon=1e-6)
    w, inputs = _case(seq + 3 * dk, cfg, batch=2, seq=seq)
    got, want = Op(cpu_session, cfg, w)(inputs), _ort(cpu_session, cfg, w)(inputs)
    tol = _ort_tolerance(cfg, seq)
    _assert_close_to_ort(got["y"], want["y"], tol, "y")
    _assert_close_to_ort(got["present_recurrent"], want["present_recurrent"], tol, "present_recurrent")
    assert np.array_equal(got["present_conv"], want["present_conv"].astype(np.float32))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_window_slots_match_ort_token_by_token(dtype, cpu_session):
    """state_window W: slot j holds what ORT's subgraph leaves after token S-W+j when run one token
    at a time from slot W-1 of the past; slots before the first token are zeros (ORT's CUDA kernels'
    semantics, measured; its CPU kernels have no window). The other past slots are never read."""
    W, seq = 4, 6
    cfg = GdnConfig(2, 4, 8, 8, state_window=W, dtype=dtype)
    flat = GdnConfig(2, 4, 8, 8, dtype=dtype)
    w, inputs = _case(21, cfg, batch=2, seq=seq)
    ort_step = _ort(cpu_session, flat, w)
    op = Op(cpu_session, cfg, w)
    for s in (2, seq):  # fewer tokens than slots, and more
        x = {k: (v[:, :s] if k in ("qkv", "z", "a", "b") else v) for k, v in inputs.items()}
        x_unread = {**x, "past_conv": x["past_conv"].copy(), "past_recurrent": x["past_recurrent"].copy()}
        x_unread["past_conv"][:W - 1] = np.nan
        x_unread["past_recurrent"][:W - 1] = np.nan
        got = op(x_unread)
        state = {"past_conv": x["past_conv"][W - 1], "past_recurrent": x["past_recurrent"][W - 1]}
        tol = _ort_tolerance(flat, s)
        for t in range(s):
            step = {k: x[k][:, t:t + 1] for k in ("qkv", "z", "a", "b")}
            out = ort_step({**step, **state})
            state = {"past_conv": out["present_conv"], "past_recurrent": out["present_recurrent"]}
            _assert_close_to_ort(got["y"][:, t:t + 1], out["y"], tol, f"S={s} y row {t}")
            j = t - (s - W)
            if j >= 0:
                assert np.array_equal(got["present_conv"][j], out["present_conv"].astype(np.float32)), (s, j)
                _assert_close_to_ort(got["present_recurrent"][j], out["present_recurrent"], tol, f"S={s} slot {j}")
        for j in range(W - s):
            assert not got["present_conv"][j].any() and not got["present_recurrent"][j].any(), f"slot {j} not zero"


# ------------------------------------------------------------------------------------------------
# Row consistency: width S against S calls of width 1, bit for bit

def _raw_equal(a, b):
    return a.shape == b.shape and a.tobytes() == b.tobytes()


WIDTH_CASES = [
    (2, 4, 8, 8, 16, 0, "float32", None),
    (2, 4, 128, 128, 4, 0, "float32", None),
    (1, 2, 8, 16, 9, 4, "float32", None),
    (2, 4, 16, 8, 12, 0, "float16", None),
    (2, 4, 8, 8, 5, 8, "float16", None),
    (2, 4, 8, 8, 6, 4, "float16", "float32"),
    (2, 2, 8, 8, 7, 4, "bfloat16", None),
]


@pytest.mark.parametrize("hk,hv,dk,dv,seq,window,dtype,state_dtype", WIDTH_CASES)
def test_width_s_equals_s_width_1_calls(hk, hv, dk, dv, seq, window, dtype, state_dtype, cpu_session):
    """Token t's y row and the state after token t (every window slot) are the same bytes whether
    the tokens come in one call or one by one; and the same with 1 or 2 threads."""
    cfg = _config(hk, hv, dk, dv, window, dtype, state_dtype)
    w, inputs = _case(seq * 13 + dk, cfg, batch=2, seq=seq)
    op = Op(cpu_session, cfg, w)
    wide = op(inputs)
    assert all(_raw_equal(wide[k], v) for k, v in Op(cpu_session, cfg, w, threads=1)(inputs).items())
    slots = max(window, 1)
    state = {"past_conv": inputs["past_conv"], "past_recurrent": inputs["past_recurrent"]}
    for t in range(seq):
        out = op({**{k: inputs[k][:, t:t + 1] for k in ("qkv", "z", "a", "b")}, **state})
        assert _raw_equal(wide["y"][:, t:t + 1], out["y"]), f"y row {t}"
        j = t - (seq - slots)  # the wide call's slot holding the state after token t
        last = (lambda s: s[slots - 1]) if window else (lambda s: s)
        if j >= 0:
            for name in ("present_conv", "present_recurrent"):
                wide_slot = wide[name][j] if window else wide[name]
                assert _raw_equal(wide_slot, last(out[name])), f"{name} after token {t}"
        state = {"past_conv": out["present_conv"], "past_recurrent": out["present_recurrent"]}


@pytest.mark.parametrize("window", [0, 4])
def test_present_bound_to_past_buffers(window, cpu_session):
    """IOBinding with present_conv / present_recurrent bound to the past tensors' own buffers (an
    in-place state update): the op reads the past slot before it writes any present slot."""
    cfg = GdnConfig(2, 4, 8, 8, state_window=window)
    w, inputs = _case(31, cfg, batch=2, seq=3)
    op = Op(cpu_session, cfg, w)
    want = op(inputs)
    values = {k: ort.OrtValue.ortvalue_from_numpy(v.copy()) for k, v in gdn.feeds(inputs, cfg).items()}
    binding = op.session.io_binding()
    for name, value in values.items():
        binding.bind_ortvalue_input(name, value)
    binding.bind_output("y")
    binding.bind_ortvalue_output("present_conv", values["past_conv"])
    binding.bind_ortvalue_output("present_recurrent", values["past_recurrent"])
    op.session.run_with_iobinding(binding)
    assert _raw_equal(binding.get_outputs()[0].numpy(), want["y"])
    assert _raw_equal(values["past_conv"].numpy(), want["present_conv"])
    assert _raw_equal(values["past_recurrent"].numpy(), want["present_recurrent"])


# ------------------------------------------------------------------------------------------------
# Errors: every one an ORT error naming the node

BASE = GdnConfig(2, 4, 8, 8, state_window=4)


def _error(cpu_session, model, inputs=None, cfg=BASE, weights=None):
    with pytest.raises(Exception) as info:
        session = cpu_session(model)
        if inputs is None:
            inputs = gdn.random_inputs(np.random.default_rng(0), cfg, 1, 2)
        session.run(None, gdn.feeds(inputs, cfg, weights))
    return str(info.value)


def _weights(cfg=BASE):
    return gdn.random_weights(np.random.default_rng(1), cfg)


@pytest.mark.parametrize(
    "attrs,expected",
    [
        ({"num_k_heads": None}, "missing required int attribute 'num_k_heads'"),
        ({"num_k_heads": 3}, "num_v_heads (4) must be a multiple of num_k_heads (3)"),
        ({"num_k_heads": 8, "num_v_heads": 4}, "num_v_heads (4) must be a multiple of num_k_heads (8)"),
        ({"k_head_dim": 0}, "attribute k_head_dim must be in [1, 65536], got 0"),
        ({"v_head_dim": 1 << 40}, "attribute v_head_dim must be in [1, 65536]"),
        ({"state_window": -1}, "attribute state_window must be in [0, 64], got -1"),
        ({"state_window": 65}, "attribute state_window must be in [0, 64], got 65"),
        ({"num_v_heads": 4.0}, "attribute 'num_v_heads' must be an int"),
        ({"scale": 1}, "attribute 'scale' must be a float"),
        ({"scale": float("nan")}, "attribute scale must be finite"),
        ({"epsilon": -1e-6}, "attribute epsilon must be finite and >= 0"),
        ({"l2norm_epsilon": float("inf")}, "attribute l2norm_epsilon must be finite and >= 0"),
    ],
)
def test_bad_attributes_fail_at_session_creation(attrs, expected, cpu_session):
    model = gdn.gated_delta_net_model(BASE, _weights(), node_name=NODE, attrs=attrs)
    with pytest.raises(Exception) as info:
        cpu_session(model)
    assert LABEL in str(info.value) and expected in str(info.value)


C = BASE.conv_dim  # 64


@pytest.mark.parametrize(
    "name,shape,expected",
    [
        ("conv_weight", [C, 1, 0], "input conv_weight has kernel size K=0"),
        ("conv_weight", [C, 2, 4], "input conv_weight has shape [64, 2, 4], expected [conv_dim, 1, K]"),
        ("conv_weight", [C + 1, 1, 4], "input conv_weight has shape [65, 1, 4]"),
        ("conv_bias", [C - 1], "input conv_bias has shape [63], expected [conv_dim] = [64]"),
        ("dt_bias", [3], "input dt_bias has shape [3], expected [num_v_heads] = [4]"),
        ("neg_exp_A", [1, 4], "input neg_exp_A has shape [1, 4]"),
        ("norm_weight", [16], "input norm_weight has shape [16], expected [v_head_dim] = [8]"),
    ],
)
def test_bad_weight_initializers_fail_at_session_creation(name, shape, expected, cpu_session):
    w = _weights()
    setattr(w, name, np.zeros(shape, np.float32))
    with pytest.raises(Exception) as info:
        cpu_session(gdn.gated_delta_net_model(BASE, w, node_name=NODE))
    assert LABEL in str(info.value) and expected in str(info.value)


def _inputs(batch=1, seq=2, cfg=BASE, **replace):
    x = gdn.random_inputs(np.random.default_rng(2), cfg, batch, seq)
    x.update({k: np.zeros(v, np.float32) for k, v in replace.items()})
    return x


@pytest.mark.parametrize(
    "replace,expected",
    [
        ({"qkv": [1, 2, C - 1]}, "input qkv has shape [1, 2, 63], expected [B, S, 2 * num_k_heads * k_head_dim"),
        ({"qkv": [2, 64]}, "input qkv has shape [2, 64]"),
        ({"qkv": [1, 0, C], "z": [1, 0, 32], "a": [1, 0, 4], "b": [1, 0, 4]}, "a call needs at least 1 token"),
        ({"z": [1, 3, 32]}, "input z has shape [1, 3, 32], expected [B, S, num_v_heads * v_head_dim] = [1, 2, 32]"),
        ({"a": [1, 2, 2]}, "input a has shape [1, 2, 2]"),
        ({"b": [2, 2, 4]}, "input b has shape [2, 2, 4]"),
        ({"past_conv": [4, 1, C, 4]},
         "input past_conv has shape [4, 1, 64, 4], expected [state_window, B, conv_dim, K - 1] = [4, 1, 64, 3]"),
        ({"past_conv": [1, C, 3]}, "input past_conv has shape [1, 64, 3]"),
        ({"past_conv": [3, 1, C, 3]}, "input past_conv has shape [3, 1, 64, 3]"),
        ({"past_recurrent": [4, 2, 4, 8, 8]}, "input past_recurrent has shape [4, 2, 4, 8, 8]"),
        ({"past_recurrent": [4, 1, 4, 8]}, "input past_recurrent has shape [4, 1, 4, 8]"),
    ],
)
def test_bad_input_shapes_fail_at_run(replace, expected, cpu_session):
    model = gdn.gated_delta_net_model(BASE, _weights(), node_name=NODE)
    message = _error(cpu_session, model, _inputs(**replace))
    assert LABEL in message and expected in message


def test_recurrent_state_in_v_major_layout_is_refused(cpu_session):
    """com.microsoft::GatedDeltaNet keeps [B, Hv, dv, dk]; this op's state is LinearAttention's
    [B, Hv, dk, dv]. With dk != dv the swap is a shape error, not silently transposed values."""
    cfg = GdnConfig(2, 4, 8, 16)
    model = gdn.gated_delta_net_model(cfg, _weights(cfg), node_name=NODE)
    message = _error(cpu_session, model, _inputs(cfg=cfg, past_recurrent=[1, 4, 16, 8]), cfg)
    expected = "expected [B, num_v_heads, k_head_dim, v_head_dim] (state_window 0) = [1, 4, 8, 16]"
    assert LABEL in message and expected in message


def test_weights_as_graph_inputs_are_checked_at_run(cpu_session):
    w = _weights()
    model = gdn.gated_delta_net_model(BASE, None, node_name=NODE)
    session = cpu_session(model)
    good = gdn.feeds(_inputs(), BASE, w)
    session.run(None, good)
    for name, shape, expected in [("conv_weight", [C, 1, 5], "input past_conv has shape [4, 1, 64, 3], expected "
                                   "[state_window, B, conv_dim, K - 1] = [4, 1, 64, 4]"),
                                  ("norm_weight", [4], "input norm_weight has shape [4]")]:
        with pytest.raises(Exception) as info:
            session.run(None, {**good, name: np.zeros(shape, np.float32)})
        assert LABEL in str(info.value) and expected in str(info.value)


@pytest.mark.parametrize(
    "cfg,input_dtypes,expected",
    [
        (BASE, {"past_recurrent": "float16"}, "input past_recurrent is float16, expected float32"),
        (GdnConfig(2, 4, 8, 8, dtype="float16"), {"past_recurrent": "bfloat16"},
         "input past_recurrent is bfloat16, expected float16 or float32"),
        (BASE, {"past_recurrent": "float64"}, "input past_recurrent is float64, expected float32"),
    ],
)
def test_bad_state_type_fails_at_run(cfg, input_dtypes, expected, cpu_session):
    dtype = input_dtypes["past_recurrent"]
    model = gdn.gated_delta_net_model(cfg, _weights(cfg), node_name=NODE, input_dtypes=input_dtypes,
                                      output_dtypes={"present_recurrent": dtype})
    x = _inputs(cfg=cfg)
    feeds = gdn.feeds(x, cfg)
    feeds["past_recurrent"] = (ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
        np.zeros(x["past_recurrent"].shape, np.uint16), gdn.ELEM_TYPES[dtype]) if dtype == "bfloat16"
        else x["past_recurrent"].astype(dtype))
    with pytest.raises(Exception) as info:
        cpu_session(model).run(None, feeds)
    assert LABEL in str(info.value) and expected in str(info.value)


@pytest.mark.parametrize(
    "cfg,input_dtypes",
    [
        (BASE, {"dt_bias": "float16"}),  # float32 T takes float32 gate parameters only
        (GdnConfig(2, 4, 8, 8, dtype="float16"), {"neg_exp_A": "float16"}),  # dt_bias float32: both or neither
        (GdnConfig(2, 4, 8, 8, dtype="float16"), {"qkv": "float32"}),
        (BASE, {"conv_weight": "float16"}),
    ],
)
def test_input_type_without_a_kernel_names_the_node(cfg, input_dtypes, cpu_session):
    """Typed inputs: ORT finds no kernel for the combination and says so, naming the node."""
    model = gdn.gated_delta_net_model(cfg, None, node_name=NODE, input_dtypes=input_dtypes)
    with pytest.raises(Exception) as info:
        cpu_session(model)
    assert NODE in str(info.value) and "GatedDeltaNet" in str(info.value)


@pytest.mark.parametrize("output,dtype", [("y", "float16"), ("present_conv", "float16"),
                                          ("present_recurrent", "float16"), ("present_recurrent", "float64")])
def test_declared_output_of_another_type_is_refused(output, dtype, cpu_session):
    """ORT sizes output buffers from the declared types: a narrower one must never be written as if
    it were the op's. Refused at load (typed outputs, and present_recurrent typed from
    past_recurrent) or at run, naming the node either way."""
    model = gdn.gated_delta_net_model(BASE, _weights(), node_name=NODE, output_dtypes={output: dtype})
    message = _error(cpu_session, model)
    assert NODE in message and output in message


@pytest.mark.parametrize("n_inputs,n_outputs", [(10, None), (None, 2)])
def test_node_arity(n_inputs, n_outputs, cpu_session):
    """A node without past_recurrent, or without present_recurrent: ORT's schema check refuses it
    (the kernel checks the counts too), naming the node."""
    model = gdn.gated_delta_net_model(BASE, _weights(), node_name=NODE, n_inputs=n_inputs, n_outputs=n_outputs)
    with pytest.raises(Exception) as info:
        cpu_session(model)
    assert NODE in str(info.value)


def test_required_input_left_empty(cpu_session):
    """Only conv_bias is optional: ORT refuses an empty name for any other input (input 8:
    norm_weight), naming the node."""
    model = gdn.gated_delta_net_model(BASE, None, node_name=NODE, input_dtypes={"norm_weight": None})
    with pytest.raises(Exception) as info:
        cpu_session(model)
    assert NODE in str(info.value) and "input 8" in str(info.value)


def test_empty_batch_and_no_conv_bias(cpu_session):
    """B = 0 runs and returns empty tensors; conv_bias may be left out (empty name)."""
    w = _weights()
    w.conv_bias = None
    op = Op(cpu_session, BASE, w)
    out = op(_inputs(batch=0))
    assert out["y"].shape == (0, 2, 32) and out["present_recurrent"].shape == (4, 0, 4, 8, 8)
    inputs = _inputs()
    _assert_close_to_reference(op(inputs)["y"], gdn.reference(BASE, w, inputs)["y"], BASE, 2, "y")


def test_session_still_usable_after_errors(cpu_session):
    model = gdn.gated_delta_net_model(BASE, _weights(), node_name=NODE)
    session = cpu_session(model)
    with pytest.raises(Exception):
        session.run(None, gdn.feeds(_inputs(z=[1, 3, 32]), BASE))
    session.run(None, gdn.feeds(_inputs(), BASE))
