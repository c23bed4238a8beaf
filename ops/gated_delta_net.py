"""ort_mtp::GatedDeltaNet in numpy: the float64 reference, random weights and inputs, the one-node model,
and the com.microsoft subgraph the op replaces, for the tests and device checks.

    GatedDeltaNet(qkv, z, a, b, conv_weight, conv_bias, dt_bias, neg_exp_A, norm_weight,
                  past_conv, past_recurrent) -> (y, present_conv, present_recurrent)

One node for the whole linear-attention mixer of a Qwen3.5 layer, from the projections' outputs to
out_proj's input (README.md, "Op reference"). `reference` is Hugging Face's Qwen3_5GatedDeltaNet in
recurrent form (transformers/models/qwen3_5/modeling_qwen3_5.py: causal_conv1d_update, l2norm,
torch_recurrent_gated_delta_rule, Qwen3_5RMSNormGated) in float64, with the op's contract on top: the
roundings of the com.microsoft subgraph that onnxruntime-genai's builder and models/graph.py emit
(`ort_subgraph_model`). Every tensor that subgraph materialises (conv output, normalised q and k, q
scaled, decay, beta, the attention output, y) is rounded to float32 and then to T, and the recurrent
state to its own type after every token, as a call of width 1 stores it. Where HF and that subgraph
differ, the subgraph wins: l2 norm epsilon 0 by default (LpNormalization; HF's l2norm adds 1e-6,
the `l2norm_epsilon` attribute), GatedRMSNorm all in float (HF rounds the normed value to T before the
weight), q scaled by a T constant after the norm.

Arrays are float32 holding values exactly representable in their ONNX type (bfloat16 included, which
numpy lacks: a model built with float32_io=True takes and returns float32 around Casts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from .nbits import round_to

OP_NAME = "GatedDeltaNet"
ELEM_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
INPUTS = ("qkv", "z", "a", "b", "conv_weight", "conv_bias", "dt_bias", "neg_exp_A", "norm_weight",
          "past_conv", "past_recurrent")
OUTPUTS = ("y", "present_conv", "present_recurrent")
WEIGHTS = ("conv_weight", "conv_bias", "dt_bias", "neg_exp_A", "norm_weight")
ACTIVATIONS = ("qkv", "z", "a", "b", "past_conv", "past_recurrent")
MS = "com.microsoft"


@dataclass(frozen=True)
class GdnConfig:
    """The op's attributes and types. state_dtype: the recurrent state's type (None: T); gate_dtype:
    dt_bias' and neg_exp_A's ("float32", the builder's, or T); scale None: the op's default, 1/sqrt(dk)
    rounded to T (the value of the builder's q_scaled constant)."""

    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int = 4
    state_window: int = 0
    dtype: str = "float32"
    state_dtype: str | None = None
    gate_dtype: str = "float32"
    scale: float | None = None
    epsilon: float = 1e-6
    l2norm_epsilon: float = 0.0

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.v_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def recurrent_dtype(self) -> str:
        return self.state_dtype or self.dtype

    @property
    def q_scale(self) -> float:
        """The q multiplier the op applies (float32 -> T rounding of 1/sqrt(dk) when scale is None)."""
        if self.scale is not None:
            return float(np.float32(self.scale))
        return float(round_to(np.float32(1.0 / np.sqrt(self.k_head_dim)), self.dtype))

    def window(self) -> list[int]:
        return [self.state_window] if self.state_window else []

    def conv_state_shape(self, batch) -> list:
        return [*self.window(), batch, self.conv_dim, self.conv_kernel - 1]

    def recurrent_state_shape(self, batch) -> list:
        return [*self.window(), batch, self.num_v_heads, self.k_head_dim, self.v_head_dim]

    def attributes(self) -> dict:
        attrs = dict(num_k_heads=self.num_k_heads, num_v_heads=self.num_v_heads, k_head_dim=self.k_head_dim,
                     v_head_dim=self.v_head_dim, state_window=self.state_window, epsilon=float(self.epsilon),
                     l2norm_epsilon=float(self.l2norm_epsilon))
        if self.scale is not None:
            attrs["scale"] = float(self.scale)
        return attrs


@dataclass
class GdnWeights:
    """conv_weight [conv_dim, 1, K], conv_bias [conv_dim] or None, dt_bias and neg_exp_A [Hv],
    norm_weight [dv]; float32 arrays of values representable in their types."""

    conv_weight: np.ndarray
    conv_bias: np.ndarray | None
    dt_bias: np.ndarray
    neg_exp_A: np.ndarray
    norm_weight: np.ndarray

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in WEIGHTS if getattr(self, name) is not None}


def weight_dtype(cfg: GdnConfig, name: str) -> str:
    return cfg.gate_dtype if name in ("dt_bias", "neg_exp_A") else cfg.dtype


def input_dtype(cfg: GdnConfig, name: str) -> str:
    if name in WEIGHTS:
        return weight_dtype(cfg, name)
    return cfg.recurrent_dtype if name == "past_recurrent" else cfg.dtype


def output_dtype(cfg: GdnConfig, name: str) -> str:
    return cfg.recurrent_dtype if name == "present_recurrent" else cfg.dtype


def random_weights(rng: np.random.Generator, cfg: GdnConfig, *, conv_bias: bool = True) -> GdnWeights:
    """Weights of Qwen3.5's scales: the conv as nn.Conv1d initialises it, A in a range that keeps the
    state alive over many tokens (decay exp(g) mostly in 0.1..0.9), norm weight near 1."""
    K, C, hv = cfg.conv_kernel, cfg.conv_dim, cfg.num_v_heads
    t, g = cfg.dtype, cfg.gate_dtype
    return GdnWeights(
        conv_weight=round_to(rng.standard_normal((C, 1, K)) / np.sqrt(K), t),
        conv_bias=round_to(0.1 * rng.standard_normal(C), t) if conv_bias else None,
        dt_bias=round_to(0.5 * rng.standard_normal(hv), g),
        neg_exp_A=round_to(-rng.uniform(0.05, 2.0, hv), g),
        norm_weight=round_to(1.0 + 0.1 * rng.standard_normal(cfg.v_head_dim), t),
    )


def random_inputs(rng: np.random.Generator, cfg: GdnConfig, batch: int, seq: int) -> dict[str, np.ndarray]:
    """The activations and past states of one call (every window slot different)."""
    t, s = cfg.dtype, cfg.recurrent_dtype
    return {
        "qkv": round_to(rng.standard_normal((batch, seq, cfg.conv_dim)), t),
        "z": round_to(rng.standard_normal((batch, seq, cfg.value_dim)), t),
        "a": round_to(rng.standard_normal((batch, seq, cfg.num_v_heads)), t),
        "b": round_to(rng.standard_normal((batch, seq, cfg.num_v_heads)), t),
        "past_conv": round_to(rng.standard_normal(cfg.conv_state_shape(batch)), t),
        "past_recurrent": round_to(0.3 * rng.standard_normal(cfg.recurrent_state_shape(batch)), s),
    }


# ---------------------------------------------------------------------------------------------------
# The float64 reference

def _rounded(x, dtype: str) -> np.ndarray:
    """float64 x rounded to float32 and then to dtype (what a float kernel writing a dtype tensor does)."""
    return round_to(np.asarray(x, np.float64).astype(np.float32), dtype).astype(np.float64)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _silu(x):
    return x * _sigmoid(x)


def _softplus(x):
    return np.where(x > 0, x + np.log1p(np.exp(-np.abs(x))), np.log1p(np.exp(np.minimum(x, 0))))


def _l2_normalize(x, eps: float, dtype: str):
    """LpNormalization(p=2) over the last axis (a zero vector stays zero); HF's l2norm when eps > 0."""
    norm = np.sqrt((x * x).sum(-1, keepdims=True) + eps)
    return np.where(norm > 0, _rounded(x / np.where(norm > 0, norm, 1.0), dtype), 0.0)


def reference(cfg: GdnConfig, w: GdnWeights, inputs: dict[str, np.ndarray],
              magnitudes: bool = False) -> dict[str, np.ndarray]:
    """y, present_conv and present_recurrent of one call (float32 arrays).

    magnitudes: also "y_magnitude" (float64, y's shape), the scale of a float32 kernel's rounding
    error in y, for a test's bound: the recurrence run again on absolute values (|state|, |k|, |q|,
    |v| + |kv_mem|), so that o_j's rounding error is at most a few float32 roundings of A_j = sum_i
    |S_ij| |q_i| however much the signed sum o_j cancels, carried through the gated norm (o_j times
    1/rms(o), whose own error follows the largest A over the row)."""
    T, W, K = cfg.dtype, cfg.state_window, cfg.conv_kernel
    L, hk, hv, dk, dv = K - 1, cfg.num_k_heads, cfg.num_v_heads, cfg.k_head_dim, cfg.v_head_dim
    f64 = {k: np.asarray(v, np.float64) for k, v in inputs.items()}
    qkv = f64["qkv"]
    B, S, C = qkv.shape
    slots = max(W, 1)
    past_conv = f64["past_conv"][W - 1] if W else f64["past_conv"]  # [B, C, L]: only slot W-1 is read
    state = f64["past_recurrent"][W - 1] if W else f64["past_recurrent"]

    # causal_conv1d_update: a depthwise conv over [conv_state, new inputs] along time, then SiLU
    x = np.concatenate([past_conv, qkv.transpose(0, 2, 1)], axis=2)  # [B, C, L + S]
    weight = w.conv_weight[:, 0, :].astype(np.float64)
    bias = np.zeros(C) if w.conv_bias is None else w.conv_bias.astype(np.float64)
    acc = bias[None, :, None] + sum(weight[None, :, j, None] * x[:, :, j:j + S] for j in range(K))
    conv = _rounded(_silu(acc), T).transpose(0, 2, 1)  # [B, S, C]
    # slot j: the last L inputs up to token S - slots + j; zeros for a token before this call's first
    present_conv = np.zeros((slots, B, C, L))
    for j in range(slots):
        t = S - slots + j
        if t >= 0:
            present_conv[j] = x[:, :, t + 1:t + 1 + L]

    kd = cfg.key_dim
    q = conv[..., :kd].reshape(B, S, hk, dk)
    k = conv[..., kd:2 * kd].reshape(B, S, hk, dk)
    v = conv[..., 2 * kd:].reshape(B, S, hv, dv)
    q = _rounded(_l2_normalize(q, cfg.l2norm_epsilon, T) * cfg.q_scale, T)
    k = _l2_normalize(k, cfg.l2norm_epsilon, T)
    g = _rounded(w.neg_exp_A.astype(np.float64) * _softplus(f64["a"] + w.dt_bias.astype(np.float64)), T)
    beta = _rounded(_sigmoid(f64["b"]), T)
    # Grouped value attention: each q/k head serves num_v_heads // num_k_heads consecutive v heads
    q, k = (np.repeat(x_, hv // hk, axis=2) for x_ in (q, k))

    # torch_recurrent_gated_delta_rule, the state stored (rounded) after every token
    o = np.zeros((B, S, hv, dv))
    o_mag = np.zeros((B, S, hv, dv))  # A_j per token (magnitudes only)
    state_mag = np.abs(state)
    present_rec = np.zeros((slots, B, hv, dk, dv))
    for t in range(S):
        state = state * np.exp(g[:, t])[..., None, None]
        kv_mem = (state * k[:, t, ..., None]).sum(-2)
        delta = (v[:, t] - kv_mem) * beta[:, t, :, None]
        state = state + k[:, t, ..., None] * delta[..., None, :]
        o[:, t] = _rounded((state * q[:, t, ..., None]).sum(-2), T)
        if magnitudes:
            state_mag = state_mag * np.exp(g[:, t])[..., None, None]
            kv_mag = (state_mag * np.abs(k[:, t, ..., None])).sum(-2)
            delta_mag = (np.abs(v[:, t]) + kv_mag) * beta[:, t, :, None]
            state_mag = state_mag + np.abs(k[:, t, ..., None]) * delta_mag[..., None, :]
            o_mag[:, t] = (state_mag * np.abs(q[:, t, ..., None])).sum(-2)
        state = _rounded(state, cfg.recurrent_dtype)
        if t >= S - slots:
            present_rec[t - (S - slots)] = state

    # GatedRMSNorm over each v head: o * rsqrt(mean(o^2) + eps) * weight * silu(z)
    z = f64["z"].reshape(B, S, hv, dv)
    inv_rms = 1.0 / np.sqrt((o * o).mean(-1, keepdims=True) + cfg.epsilon)
    gain = inv_rms * w.norm_weight.astype(np.float64) * _silu(z)
    y = _rounded(o * gain, T).reshape(B, S, hv * dv)
    if not W:
        present_conv, present_rec = present_conv[0], present_rec[0]
    out = {"y": y.astype(np.float32), "present_conv": present_conv.astype(np.float32),
           "present_recurrent": present_rec.astype(np.float32)}
    if magnitudes:
        # d(1/rms)/(1/rms) = -sum_i o_i e_i / (n (mean(o^2) + eps)), |e_i| <= c A_i
        inv_rms_rel = o_mag.max(-1, keepdims=True) * np.abs(o).mean(-1, keepdims=True) * inv_rms**2
        out["y_magnitude"] = (np.abs(gain) * (o_mag + np.abs(o) * inv_rms_rel)).reshape(B, S, hv * dv)
    return out


# ---------------------------------------------------------------------------------------------------
# Models

def elem_type(dtype: str) -> int:
    """ONNX element type of a dtype name ("bfloat16" included; others as numpy names them)."""
    return ELEM_TYPES.get(dtype) or helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _initializer(name: str, values: np.ndarray, dtype: str) -> TensorProto:
    values = np.asarray(values, np.float32)
    if dtype == "bfloat16":
        bits = (round_to(values, "bfloat16").view(np.uint32) >> 16).astype(np.uint16)
        return helper.make_tensor(name, TensorProto.BFLOAT16, values.shape, bits.tobytes(), raw=True)
    return onnx.numpy_helper.from_array(values.astype(dtype), name)


def _model(nodes, inputs, outputs, initializers, name: str, value_info=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers, value_info=list(value_info))
    # ir_version 10: ORT 1.31 refuses newer IR versions.
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid(MS, 1), helper.make_opsetid("ort_mtp", 1)])


def gated_delta_net_model(cfg: GdnConfig, weights: GdnWeights | None = None, *, node_name: str = "gdn",
                          float32_io: bool = False, attrs: dict | None = None,
                          input_dtypes: dict[str, str | None] | None = None,
                          output_dtypes: dict[str, str] | None = None,
                          n_inputs: int | None = None, n_outputs: int | None = None) -> onnx.ModelProto:
    """A model of one GatedDeltaNet node named node_name, its graph inputs and outputs named as the
    op's (INPUTS, OUTPUTS). weights: initializers (the real models' way, checked at session creation),
    or None for graph inputs. float32_io: the graph takes and returns float32, with Casts to and from
    the node's types (for bfloat16, which numpy cannot feed). Weights without conv_bias give the node
    an empty conv_bias input. To build malformed nodes: attrs overrides cfg.attributes() (a None value
    drops the attribute), input_dtypes / output_dtypes override the types of the node's inputs /
    declared outputs (an input of type None is left out, as an empty name), n_inputs / n_outputs keep
    only the node's first inputs / outputs."""
    node_attrs = {**cfg.attributes(), **(attrs or {})}
    node_attrs = {k: v for k, v in node_attrs.items() if v is not None}
    in_types = {name: input_dtype(cfg, name) for name in INPUTS}
    in_types.update(input_dtypes or {})
    out_types = {name: output_dtype(cfg, name) for name in OUTPUTS}
    out_types.update(output_dtypes or {})

    def present(name):
        if weights is not None and name in WEIGHTS:
            return getattr(weights, name) is not None
        return in_types[name] is not None

    node_inputs = [name if present(name) else "" for name in INPUTS][:n_inputs]
    node_outputs = list(OUTPUTS)[:n_outputs]
    casts_in, casts_out, graph_inputs, graph_outputs, initializers, value_info = [], [], [], [], [], []
    wired_inputs, wired_outputs = [], []
    for name in node_inputs:
        dtype = in_types.get(name)
        if not name:
            wired_inputs.append("")
        elif weights is not None and name in WEIGHTS:
            initializers.append(_initializer(name, getattr(weights, name), dtype))
            wired_inputs.append(name)
        elif float32_io and dtype != "float32":
            graph_inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
            casts_in.append(helper.make_node("Cast", [name], [f"{name}_{dtype}"], to=elem_type(dtype)))
            wired_inputs.append(f"{name}_{dtype}")
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, elem_type(dtype), None))
            wired_inputs.append(name)
    for name in node_outputs:
        dtype = out_types[name]
        if float32_io and dtype != "float32":
            # The node's output keeps its type, declared as value_info (ORT sizes the buffer from it).
            value_info.append(helper.make_tensor_value_info(f"{name}_{dtype}", elem_type(dtype), None))
            casts_out.append(helper.make_node("Cast", [f"{name}_{dtype}"], [name], to=TensorProto.FLOAT))
            graph_outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
            wired_outputs.append(f"{name}_{dtype}")
        else:
            graph_outputs.append(helper.make_tensor_value_info(name, elem_type(dtype), None))
            wired_outputs.append(name)
    node = helper.make_node(OP_NAME, wired_inputs, wired_outputs, name=node_name, domain="ort_mtp", **node_attrs)
    return _model([*casts_in, node, *casts_out], graph_inputs, graph_outputs, initializers, "gated_delta_net",
                  value_info)


def feeds(inputs: dict[str, np.ndarray], cfg: GdnConfig, weights: GdnWeights | None = None,
          float32_io: bool = False) -> dict[str, np.ndarray]:
    """session.run feeds for gated_delta_net_model: the activations (and the weights when they are
    graph inputs), each in its graph input's numpy type."""
    values = dict(inputs)
    if weights is not None:
        values.update(weights.arrays())
    out = {}
    for name, value in values.items():
        dtype = input_dtype(cfg, name)
        out[name] = np.asarray(value, np.float32 if float32_io or dtype == "bfloat16" else dtype)
    return out


def ort_subgraph_model(cfg: GdnConfig, w: GdnWeights) -> onnx.ModelProto:
    """The com.microsoft node sequence of one linear-attention mixer, as models/graph.py's
    linear_attention (and onnxruntime-genai's builder) emit it from qkv_proj's, z_proj's, a_proj's and
    b_proj's outputs to out_proj's input, with the op's graph inputs and outputs. float32 or float16
    (the CPU EP has no bfloat16 kernels for them), dt_bias and neg_exp_A float32 (LinearAttentionGate
    takes no other), state_window 0 on the CPU EP (its kernels refuse a window)."""
    T, S = ELEM_TYPES[cfg.dtype], ELEM_TYPES[cfg.recurrent_dtype]
    if cfg.gate_dtype != "float32":
        raise ValueError("LinearAttentionGate takes float32 dt_bias and neg_exp_A")
    hk, dk, kd, vd = cfg.num_k_heads, cfg.k_head_dim, cfg.key_dim, cfg.value_dim
    inputs = [helper.make_tensor_value_info("qkv", T, ["B", "S", cfg.conv_dim]),
              helper.make_tensor_value_info("z", T, ["B", "S", vd]),
              helper.make_tensor_value_info("a", T, ["B", "S", cfg.num_v_heads]),
              helper.make_tensor_value_info("b", T, ["B", "S", cfg.num_v_heads]),
              helper.make_tensor_value_info("past_conv", T, cfg.conv_state_shape("B")),
              helper.make_tensor_value_info("past_recurrent", S, cfg.recurrent_state_shape("B"))]
    outputs = [helper.make_tensor_value_info("y", T, ["B", "S", vd]),
               helper.make_tensor_value_info("present_conv", T, cfg.conv_state_shape("B")),
               helper.make_tensor_value_info("present_recurrent", S, cfg.recurrent_state_shape("B"))]
    conv_bias = w.conv_bias if w.conv_bias is not None else np.zeros(cfg.conv_dim, np.float32)
    inits = [_initializer("conv_weight", w.conv_weight, cfg.dtype), _initializer("conv_bias", conv_bias, cfg.dtype),
             _initializer("dt_bias", w.dt_bias, "float32"), _initializer("neg_exp_A", w.neg_exp_A, "float32"),
             _initializer("norm_weight", w.norm_weight, cfg.dtype),
             _initializer("q_scale", np.array(cfg.q_scale, np.float32), cfg.dtype),
             onnx.numpy_helper.from_array(np.array([kd, kd, vd], np.int64), "split_sizes"),
             onnx.numpy_helper.from_array(np.array([0, 0, hk, dk], np.int64), "heads_shape"),
             onnx.numpy_helper.from_array(np.array([0, 0, kd], np.int64), "flat_shape")]
    window = dict(state_window=cfg.state_window)
    nodes = [
        helper.make_node("Transpose", ["qkv"], ["qkv_t"], perm=[0, 2, 1]),
        helper.make_node("CausalConvWithState", ["qkv_t", "conv_weight", "conv_bias", "past_conv"],
                         ["conv", "present_conv"], domain=MS, ndim=1, activation="silu", **window),
        helper.make_node("Transpose", ["conv"], ["conv_t"], perm=[0, 2, 1]),
        helper.make_node("Split", ["conv_t", "split_sizes"], ["q", "k", "v"], axis=-1),
    ]
    for x in ("q", "k"):
        nodes += [helper.make_node("Reshape", [x, "heads_shape"], [f"{x}_heads"]),
                  helper.make_node("LpNormalization", [f"{x}_heads"], [f"{x}_normed"], axis=-1, p=2),
                  helper.make_node("Reshape", [f"{x}_normed", "flat_shape"], [f"{x}_l2"])]
    nodes += [
        helper.make_node("Mul", ["q_l2", "q_scale"], ["q_scaled"]),
        helper.make_node("LinearAttentionGate", ["a", "dt_bias", "neg_exp_A", "b"], ["decay", "beta"], domain=MS),
        helper.make_node("LinearAttention", ["q_scaled", "k_l2", "v", "past_recurrent", "decay", "beta"],
                         ["attn", "present_recurrent"], domain=MS, q_num_heads=hk, kv_num_heads=cfg.num_v_heads,
                         update_rule="gated_delta", scale=1.0, **window),
        helper.make_node("GatedRMSNorm", ["attn", "norm_weight", "z"], ["y"], domain=MS, epsilon=float(cfg.epsilon)),
    ]
    return _model(nodes, inputs, outputs, inits, "linear_attention")
