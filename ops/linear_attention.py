"""One Gated DeltaNet mixer (a linear-attention block) -> one ort_mtp::GatedDeltaNet node.

The block, as onnxruntime-genai 0.18's builder emits it for Qwen3.5 (builders/qwen.py,
make_qwen_gated_delta_net with linear_attn_op=linear_attention: CPU fp32, and CUDA fp16 with or
without state_window) and as models/graph.py emits it node for node:

    qkv -> Transpose(0,2,1) -> com.microsoft CausalConvWithState(weight, bias?, past.N.conv; silu)
        -> Transpose(0,2,1) -> Split(axis -1, [kd, kd, vd]) -> q, k, v
    q -> Reshape([0,0,Hk,dk]) -> LpNormalization(p=2, axis -1) -> Reshape([0,0,kd]) -> Mul(scale)
    k -> Reshape([0,0,Hk,dk]) -> LpNormalization(p=2, axis -1) -> Reshape([0,0,kd])
    a, b -> com.microsoft LinearAttentionGate(a, dt_bias, neg_exp_A, b) -> decay, beta
    com.microsoft LinearAttention(q, k, v, past.N.recurrent, decay, beta; gated_delta)
        -> com.microsoft GatedRMSNorm(norm_weight, z) -> y (out_proj's input)

becomes GatedDeltaNet(qkv, z, a, b, conv_weight, conv_bias, dt_bias, neg_exp_A, norm_weight,
past_conv, past_recurrent) -> (y, present_conv, present_recurrent), with attributes num_k_heads,
num_v_heads, k_head_dim, v_head_dim, state_window, scale (the q multiplier times LinearAttention's
own scale, whose 0 means 1/sqrt(dk)) and epsilon. The Mul may hold its constant on either side (the
rule's commuted form), or be absent (the scale is then LinearAttention's alone). A block that differs
in anything the op does not compute (another update rule or activation, a channels-last or dilated
conv, another split, a q/k norm over something but the heads, a value inside the block read outside
it, an unsupported dtype, ...) is kept as it is and reported with the reason, naming the node.

`available(library, provider, ...)` says whether a library registers the op for an execution
provider (by creating a one-node session); `LinearAttentionRewrite(available=...)` keeps every block
with that reason when it does not, so a rewritten model always runs.
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np
import onnx
import onnx_ir as ir
from onnxscript.rewriter import RewriteRule
from onnxscript.rewriter.pattern import Var

from . import DOMAIN, probe
from .kinds import LINEAR_ATTENTION, SOURCE_DOMAIN
from .patterns import (
    PatternMismatch,
    Rewrite,
    attribute,
    check,
    check_reshape,
    dims,
    label,
    small_constant,
    unknown_attributes,
)

GATED_DELTA_NET = "GatedDeltaNet"
MS = SOURCE_DOMAIN
_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
_TYPE_NAMES = {ir.DataType.FLOAT: "float32", ir.DataType.FLOAT16: "float16", ir.DataType.BFLOAT16: "bfloat16"}


def _block(op, qkv, conv_weight, past_conv, split_sizes, q_flat_shape, q_unflat_shape, k_flat_shape,
           k_unflat_shape, q_scale, a, dt_bias, neg_exp_a, b, past_recurrent, norm_weight, z):
    conv_bias = Var("conv_bias", can_match_none=True)
    qkv_t = op.Transpose(qkv, _outputs=["qkv_t"])
    conv, present_conv = op.CausalConvWithState(qkv_t, conv_weight, conv_bias, past_conv, _domain=MS,
                                                _outputs=["conv", "present_conv"])
    conv_t = op.Transpose(conv, _outputs=["conv_t"])
    q, k, v = op.Split(conv_t, split_sizes, _outputs=["q", "k", "v"])
    q_heads = op.LpNormalization(op.Reshape(q, q_flat_shape, _outputs=["q_flat"]), _outputs=["q_heads"])
    q_norm = op.Reshape(q_heads, q_unflat_shape, _outputs=["q_norm"])
    k_heads = op.LpNormalization(op.Reshape(k, k_flat_shape, _outputs=["k_flat"]), _outputs=["k_heads"])
    k_norm = op.Reshape(k_heads, k_unflat_shape, _outputs=["k_norm"])
    q_in = q_norm if q_scale is None else op.Mul(q_norm, q_scale, _outputs=["q_scaled"])
    decay, beta = op.LinearAttentionGate(a, dt_bias, neg_exp_a, b, _domain=MS, _outputs=["decay", "beta"])
    o, present_recurrent = op.LinearAttention(q_in, k_norm, v, past_recurrent, decay, beta, _domain=MS,
                                              _outputs=["o", "present_recurrent"])
    y = op.GatedRMSNorm(o, norm_weight, z, _domain=MS, _outputs=["y"])
    return y, present_conv, present_recurrent


def _pattern(op, qkv, conv_weight, past_conv, split_sizes, q_flat_shape, q_unflat_shape, k_flat_shape,
             k_unflat_shape, q_scale, a, dt_bias, neg_exp_a, b, past_recurrent, norm_weight, z):
    """The block as the builder and models/graph.py emit it: q scaled by a Mul after its norm."""
    return _block(op, qkv, conv_weight, past_conv, split_sizes, q_flat_shape, q_unflat_shape, k_flat_shape,
                  k_unflat_shape, q_scale, a, dt_bias, neg_exp_a, b, past_recurrent, norm_weight, z)


def _pattern_unscaled(op, qkv, conv_weight, past_conv, split_sizes, q_flat_shape, q_unflat_shape, k_flat_shape,
                      k_unflat_shape, a, dt_bias, neg_exp_a, b, past_recurrent, norm_weight, z):
    """The block with the q scale left to LinearAttention's own `scale` (0: 1/sqrt(dk)), no Mul."""
    return _block(op, qkv, conv_weight, past_conv, split_sizes, q_flat_shape, q_unflat_shape, k_flat_shape,
                  k_unflat_shape, None, a, dt_bias, neg_exp_a, b, past_recurrent, norm_weight, z)


class LinearAttentionRewrite(Rewrite):
    """The linear-attention blocks of a model on ort_mtp::GatedDeltaNet.

    available(signature) -> None | str, if given, is asked once per block with the op's type
    signature (ops.linear_attention.Signature) and returns why the op cannot run it (None: it can);
    without it the rewrite is purely structural."""

    name = LINEAR_ATTENTION

    def __init__(self, available=None):
        super().__init__(available)
        self._planned: dict[ir.Node, dict] = {}

    def rules(self) -> list[RewriteRule]:
        scaled = RewriteRule(_pattern, self._replacement, self._check, name="LinearAttentionToGatedDeltaNet")
        unscaled = RewriteRule(_pattern_unscaled, self._replacement, self._check,
                               name="LinearAttentionToGatedDeltaNetUnscaledQ")
        return [*scaled.commute(), unscaled]  # commute: the q scale's Mul either way round

    def is_candidate(self, node: ir.Node) -> bool:
        return node.op_type == "LinearAttention" and node.domain == MS

    def unmatched_reason(self, candidate: ir.Node) -> str:
        users = [u for out in candidate.outputs[:1] for u, _ in out.uses()]
        if not any(u.op_type == "GatedRMSNorm" and u.domain == MS for u in users):
            return (f"{label(candidate)}: its output is not read by a com.microsoft GatedRMSNorm, the block's "
                    "last node")
        return "it does not fit the pattern"

    def block_outputs(self, root, match):
        bindings = match.bindings
        return {bindings[k] for k in ("y", "present_conv", "present_recurrent") if bindings.get(k) is not None}

    # -- check: everything the op needs, in words naming the node -----------------------------------

    @check
    def _check(self, context, **v) -> bool:
        n = {key: v[key].producer() for key in ("qkv_t", "conv", "conv_t", "q", "q_flat", "q_heads", "q_norm",
                                                 "k_flat", "k_heads", "k_norm", "q_scaled", "decay", "o", "y")
             if v.get(key) is not None}
        la = n["o"]
        self.require_selected(la)
        self._planned[context.root] = self._attributes(n, v)
        return True

    def _attributes(self, n: dict, v: dict) -> dict:
        la, conv, gate, norm, split = n["o"], n["conv"], n["decay"], n["y"], n["q"]
        for node, known in ((la, ("q_num_heads", "kv_num_heads", "update_rule", "scale", "state_window", "chunk_size")),
                            (conv, ("ndim", "activation", "state_window", "channels_last", "dilation")),
                            (gate, ()), (norm, ("epsilon", "activation")),
                            (n["qkv_t"], ("perm",)), (n["conv_t"], ("perm",)), (split, ("axis",)),
                            (n["q_flat"], ("allowzero",)), (n["q_norm"], ("allowzero",)),
                            (n["k_flat"], ("allowzero",)), (n["k_norm"], ("allowzero",)),
                            (n["q_heads"], ("axis", "p")), (n["k_heads"], ("axis", "p")), (n.get("q_scaled"), ())):
            if node is None:
                continue
            extra = unknown_attributes(node, known)
            if extra:
                raise PatternMismatch(node, f"attribute {extra[0]!r} is not supported")

        rule = attribute(la, "update_rule", "gated_delta")
        if rule != "gated_delta":
            raise PatternMismatch(la, f"update_rule {rule!r} is not supported (GatedDeltaNet computes gated_delta)")
        hk, hv = attribute(la, "q_num_heads"), attribute(la, "kv_num_heads")
        if not (isinstance(hk, int) and isinstance(hv, int) and hk > 0 and hv > 0):
            raise PatternMismatch(la, "q_num_heads and kv_num_heads must be positive")
        if hv % hk:
            raise PatternMismatch(la, f"kv_num_heads={hv} is not a multiple of q_num_heads={hk}")
        window = attribute(la, "state_window", 0)

        if attribute(conv, "ndim", 1) != 1:
            raise PatternMismatch(conv, f"ndim={attribute(conv, 'ndim')} is not supported (1)")
        activation = attribute(conv, "activation", "none")
        if activation not in ("silu", "swish"):
            raise PatternMismatch(conv, f"activation {activation!r} is not supported (GatedDeltaNet applies silu)")
        if attribute(conv, "channels_last", 0) != 0:
            raise PatternMismatch(conv, "channels_last=1 is not supported")
        if attribute(conv, "dilation", 1) != 1:
            raise PatternMismatch(conv, f"dilation={attribute(conv, 'dilation')} is not supported (1)")
        if attribute(conv, "state_window", 0) != window:
            raise PatternMismatch(conv, f"state_window={attribute(conv, 'state_window', 0)} differs from "
                                        f"{label(la)}'s {window}")
        if not isinstance(window, int) or window < 0:
            raise PatternMismatch(la, f"state_window={window} is not supported")

        for t in (n["qkv_t"], n["conv_t"]):
            if attribute(t, "perm") != [0, 2, 1]:
                raise PatternMismatch(t, f"perm={attribute(t, 'perm')} is not [0, 2, 1]")
        if attribute(split, "axis", 0) not in (-1, 2):
            raise PatternMismatch(split, f"axis={attribute(split, 'axis', 0)} is not the last axis")
        sizes = [int(x) for x in np.ravel(small_constant(v["split_sizes"], "the split sizes", split))]
        if len(sizes) != 3 or sizes[0] != sizes[1] or min(sizes) <= 0:
            raise PatternMismatch(split, f"split sizes {sizes} are not [key_dim, key_dim, value_dim]")
        key_dim, value_dim = sizes[0], sizes[2]
        if key_dim % hk or value_dim % hv:
            raise PatternMismatch(split, f"split sizes {sizes} do not divide into {hk} key heads and {hv} value heads")
        dk, dv = key_dim // hk, value_dim // hv

        for flat, heads, unflat, which in ((n["q_flat"], n["q_heads"], n["q_norm"], "q"),
                                           (n["k_flat"], n["k_heads"], n["k_norm"], "k")):
            for node in (flat, unflat):
                if attribute(node, "allowzero", 0) != 0:
                    raise PatternMismatch(node, "allowzero=1 is not supported")
            check_reshape(flat, v[f"{which}_flat_shape"], [hk, dk])
            check_reshape(unflat, v[f"{which}_unflat_shape"], [key_dim])
            if attribute(heads, "p", 2) != 2:
                raise PatternMismatch(heads, f"p={attribute(heads, 'p')} is not supported (2)")
            if attribute(heads, "axis", -1) not in (-1, 3):
                raise PatternMismatch(heads, f"axis={attribute(heads, 'axis')} is not the head axis")

        q_mul = np.float64(1.0)
        if "q_scaled" in n:
            q_mul = small_constant(v["q_scale"], "the q scale", n["q_scaled"])
            if q_mul.size != 1 or q_mul.dtype.kind != "f":
                raise PatternMismatch(n["q_scaled"], f"the q scale {v['q_scale'].name} is not one float")
        la_scale = attribute(la, "scale", 0.0)
        if la_scale == 0.0:  # LinearAttention's default: 1/sqrt(d_k)
            la_scale = 1.0 / math.sqrt(dk)
        scale = float(q_mul.reshape(()).item()) * float(la_scale)

        norm_activation = attribute(norm, "activation", "silu")
        if norm_activation not in ("silu", "swish"):
            raise PatternMismatch(norm, f"activation {norm_activation!r} is not supported (GatedDeltaNet gates with silu)")
        epsilon = float(attribute(norm, "epsilon", 1e-5))

        conv_dim = 2 * key_dim + value_dim
        _check_types_and_shapes(n, v, hk, hv, dk, dv, conv_dim, window)
        signature = Signature(v["qkv"].dtype, v["past_recurrent"].dtype, v["dt_bias"].dtype,
                              v["neg_exp_a"].dtype, bool(window))
        self.require_available(signature)
        return {"num_k_heads": hk, "num_v_heads": hv, "k_head_dim": dk, "v_head_dim": dv,
                "state_window": window, "scale": scale, "epsilon": epsilon}

    # -- replacement --------------------------------------------------------------------------------

    def _replacement(self, op, qkv, z, a, b, conv_weight, conv_bias, dt_bias, neg_exp_a, norm_weight, past_conv,
                     past_recurrent, y, o, **_):
        attrs = self._planned.pop(y.producer())
        la = o.producer()
        outputs = op.op(GATED_DELTA_NET, qkv, z, a, b, conv_weight, conv_bias, dt_bias, neg_exp_a, norm_weight,
                        past_conv, past_recurrent, _domain=DOMAIN, _outputs=3, _name=_node_name(la), **attrs)
        return list(outputs)


def _need_type(node: ir.Node, value: ir.Value | None, what: str, allowed, t=None) -> ir.DataType:
    if value is None:
        raise PatternMismatch(node, f"{what} is missing")
    dtype = value.dtype
    if dtype is None:
        raise PatternMismatch(node, f"{what} ({value.name}) has no known element type")
    if dtype not in allowed:
        names = " or ".join(_TYPE_NAMES.get(x, x.name) for x in allowed)
        extra = f" (the block's type is {_TYPE_NAMES.get(t, t)})" if t is not None else ""
        raise PatternMismatch(node, f"{what} ({value.name}) is {_TYPE_NAMES.get(dtype, dtype.name)}, "
                                    f"not {names}{extra}")
    return dtype


def _need_shape(node: ir.Node, value: ir.Value, what: str, want: list, required: bool = False) -> None:
    """value's shape matches `want` (ints must equal, None is any) where both are known."""
    have = dims(value)
    if have is None:
        if required:
            raise PatternMismatch(node, f"{what} ({value.name}) has no known shape")
        return
    if len(have) != len(want) or any(w is not None and h is not None and h != w for h, w in zip(have, want)):
        shown = ["?" if d is None else d for d in have]
        wanted = ["*" if d is None else d for d in want]
        raise PatternMismatch(node, f"{what} ({value.name}) has shape {shown}, expected {wanted}")


def _check_types_and_shapes(n, v, hk, hv, dk, dv, conv_dim, window) -> None:
    la, conv, gate, norm = n["o"], n["conv"], n["decay"], n["y"]
    t = _need_type(conv, v["qkv"], "qkv", _TYPES)
    _need_type(norm, v["z"], "z", (t,), t)
    _need_type(gate, v["a"], "a", (t,), t)
    _need_type(gate, v["b"], "b", (t,), t)
    _need_type(conv, v["conv_weight"], "the conv weight", (t,), t)
    if v["conv_bias"] is not None:
        _need_type(conv, v["conv_bias"], "the conv bias", (t,), t)
    for key, what in (("dt_bias", "dt_bias"), ("neg_exp_a", "neg_exp_A")):
        _need_type(gate, v[key], what, tuple(dict.fromkeys((t, ir.DataType.FLOAT))), t)
    _need_type(norm, v["norm_weight"], "the norm weight", (t,), t)
    _need_type(conv, v["past_conv"], "the past conv state", (t,), t)
    _need_type(la, v["past_recurrent"], "the past recurrent state", tuple(dict.fromkeys((t, ir.DataType.FLOAT))), t)

    weight = dims(v["conv_weight"])
    if weight is None or len(weight) != 3 or None in weight or weight[0] != conv_dim or weight[1] != 1 or weight[2] < 1:
        raise PatternMismatch(conv, f"the conv weight ({v['conv_weight'].name}) has shape {weight}, "
                                    f"expected [{conv_dim}, 1, K]")
    kernel = weight[2]
    if v["conv_bias"] is not None:
        _need_shape(conv, v["conv_bias"], "the conv bias", [conv_dim])
    _need_shape(gate, v["dt_bias"], "dt_bias", [hv])
    _need_shape(gate, v["neg_exp_a"], "neg_exp_A", [hv])
    _need_shape(norm, v["norm_weight"], "the norm weight", [dv], required=True)
    lead = [window] if window else []
    _need_shape(conv, v["past_conv"], "the past conv state", [*lead, None, conv_dim, kernel - 1])
    _need_shape(la, v["past_recurrent"], "the past recurrent state", [*lead, None, hv, dk, dv])
    _need_shape(conv, v["qkv"], "qkv", [None, None, conv_dim])
    _need_shape(norm, v["z"], "z", [None, None, hv * dv])
    _need_shape(gate, v["a"], "a", [None, None, hv])
    _need_shape(gate, v["b"], "b", [None, None, hv])


def _node_name(la: ir.Node) -> str:
    name = label(la)
    base = name.rsplit("/", 1)[0] if "/" in name else name
    wanted = f"{base}/{GATED_DELTA_NET}"
    taken = {node.name for node in la.graph} if la.graph is not None else set()
    candidate, i = wanted, 1
    while candidate in taken:
        candidate, i = f"{wanted}_{i}", i + 1
    return candidate


# --------------------------------------------------------------------------------------------------
# Is the op there?


class Signature(tuple):
    """What a block asks of the op beyond its attributes: (T, recurrent-state type, dt_bias type,
    neg_exp_A type, windowed)."""

    def __new__(cls, t, state, dt_bias, neg_exp_a, windowed):
        return super().__new__(cls, (t, state, dt_bias, neg_exp_a, windowed))

    def describe(self) -> str:
        t, state, dt_bias, neg_exp_a, windowed = self
        parts = [_TYPE_NAMES.get(t, str(t))]
        if state != t:
            parts.append(f"{_TYPE_NAMES.get(state, str(state))} state")
        if windowed:
            parts.append("state_window")
        return ", ".join(parts)


def _probe_model(signature: Signature) -> onnx.ModelProto:
    """One GatedDeltaNet node with the smallest shapes (1 head of 2 each, kernel 2), weights as
    initializers, I/O of the signature's types."""
    from onnx import helper

    t, state, dt_bias, neg_exp_a, windowed = (int(x) if not isinstance(x, bool) else x for x in signature)
    hk = hv = 1
    dk = dv = 2
    conv_dim, kernel, window = 2 * hk * dk + hv * dv, 2, 2 if windowed else 0
    lead = [window] if window else []
    np_type = {int(ir.DataType.FLOAT): np.float32, int(ir.DataType.FLOAT16): np.float16}

    def init(name, shape, dtype, value=0.5):
        array = np.full(shape, value, dtype=np.float32)
        if dtype in np_type:
            return onnx.numpy_helper.from_array(array.astype(np_type[dtype]), name)
        return helper.make_tensor(name, dtype, shape, array.ravel().tolist())  # bfloat16

    inits = [init("conv_weight", [conv_dim, 1, kernel], t), init("conv_bias", [conv_dim], t, 0.0),
             init("dt_bias", [hv], dt_bias, 1.0), init("neg_exp_A", [hv], neg_exp_a, -1.0),
             init("norm_weight", [dv], t, 1.0)]
    inputs = [helper.make_tensor_value_info("qkv", t, ["B", "S", conv_dim]),
              helper.make_tensor_value_info("z", t, ["B", "S", hv * dv]),
              helper.make_tensor_value_info("a", t, ["B", "S", hv]),
              helper.make_tensor_value_info("b", t, ["B", "S", hv]),
              helper.make_tensor_value_info("past_conv", t, [*lead, "B", conv_dim, kernel - 1]),
              helper.make_tensor_value_info("past_recurrent", state, [*lead, "B", hv, dk, dv])]
    outputs = [helper.make_tensor_value_info("y", t, ["B", "S", hv * dv]),
               helper.make_tensor_value_info("present_conv", t, [*lead, "B", conv_dim, kernel - 1]),
               helper.make_tensor_value_info("present_recurrent", state, [*lead, "B", hv, dk, dv])]
    node = helper.make_node(
        GATED_DELTA_NET, ["qkv", "z", "a", "b", "conv_weight", "conv_bias", "dt_bias", "neg_exp_A", "norm_weight",
                          "past_conv", "past_recurrent"], ["y", "present_conv", "present_recurrent"],
        name="probe", domain=DOMAIN, num_k_heads=hk, num_v_heads=hv, k_head_dim=dk, v_head_dim=dv,
        state_window=window, scale=1.0 / math.sqrt(dk), epsilon=1e-6)
    graph = helper.make_graph([node], "gated_delta_net_probe", inputs, outputs, initializer=inits)
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                  helper.make_opsetid(DOMAIN, 1)])


def available(library: str, provider: str = "cpu", signature: Signature | None = None,
              device_id: int = 0) -> str | None:
    """None when `library` registers ort_mtp::GatedDeltaNet for `provider` ("cpu" or "cuda") and
    the signature's types (default: float32, unwindowed), else why not, in one line. Creates a
    one-node session (a few ms; the answer is cached per library file). On CUDA the node must be
    placed on the CUDA EP itself: a CPU-only kernel would break CUDA graphs and copy every state."""
    if provider not in probe.PROVIDERS:
        return f"ort_mtp::{GATED_DELTA_NET} has kernels for the CPU and CUDA EPs only, not {provider}"
    signature = signature or Signature(ir.DataType.FLOAT, ir.DataType.FLOAT, ir.DataType.FLOAT,
                                       ir.DataType.FLOAT, False)
    try:
        stamp = os.stat(library).st_mtime_ns
    except OSError as e:
        return f"the custom-op library {library} cannot be read ({e.strerror})"
    return _available(library, stamp, provider, tuple(int(x) for x in signature), device_id)


@functools.lru_cache(maxsize=64)
def _available(library: str, stamp: int, provider: str, signature: tuple, device_id: int) -> str | None:
    sig = Signature(*(ir.DataType(x) for x in signature[:4]), bool(signature[4]))
    return probe.refusal(library, provider, _probe_model(sig), GATED_DELTA_NET, sig.describe(), device_id)
