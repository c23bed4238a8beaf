"""A Qwen3.5 gated full-attention mixer -> one ort_mtp::GatedAttention node (csrc/attention/gated_attention.cc
has its arithmetic), where the library runs it (the CPU EP).

The mixer, as onnxruntime-genai's builder emits it and models/graph.py emits it node for node, from
qkv_proj's output to o_proj's input (a 16-bit folder runs each MRotaryEmbedding in float32 between a
Cast to float and a Cast back, which the rule's second form takes):

    qkv -> Split(axis -1, [2 Nq H, Nkv H, Nkv H]) -> q_gate, k, v
    q_gate -> Reshape([0, 0, Nq, 2 H]) -> Split(axis -1, [H, H]) -> Reshape([0, 0, Nq H]) each -> q, gate
    q -> Reshape([0, -1, H]) -> SimplifiedLayerNormalization(q_norm) -> Reshape([0, -1, Nq H])
      -> com.microsoft MRotaryEmbedding(position_ids, cos_cache, sin_cache)
    k -> the same with k_norm and Nkv heads
    GroupQueryAttention(q, k, v, past_key, past_value, seqlens_k, total_sequence_length)
    -> Mul(attention, Sigmoid(gate)) -> y

(ours after the attention rewrite: the rewrite runs after it) becomes GatedAttention(qkv, past_key,
past_value, seqlens_k, total_sequence_length, position_ids, cos_cache, sin_cache, q_norm, k_norm) ->
(y, present_key, present_value): sixteen nodes per attention layer become one, and the query rows
still do not depend on the forward's width. Its arithmetic is its own (double per step, rounded where a
node of the graph writes a tensor), so its output may differ from the sixteen nodes' by float32
rounding. A mixer that differs in anything the op does not compute (another split or reshape, norms
with different epsilons or over another axis, interleaved or scaled rotary, the two rotaries not
sharing positions and caches, casts to anything but float32 and back, a value inside the block read
outside it, a type the library has no kernel for on the model's provider: on CUDA when the library
was loaded with ORT_MTP_GATED_ATTENTION_CUDA=0) is kept as it is and reported with the
reason. Candidates are ort_mtp::GroupQueryAttention nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import RewriteRule

from . import DOMAIN, probe
from .group_query_attention import GqaConfig
from .group_query_attention import reference as gqa_reference
from .kinds import GATED_ATTENTION
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

OP = "GatedAttention"
MS = "com.microsoft"
GQA = "GroupQueryAttention"
INPUTS = ("qkv", "past_key", "past_value", "seqlens_k", "total_sequence_length", "position_ids", "cos_cache",
          "sin_cache", "q_norm_weight", "k_norm_weight")
OUTPUTS = ("output", "present_key", "present_value")
_TYPES = {ir.DataType.FLOAT: "float32", ir.DataType.FLOAT16: "float16", ir.DataType.BFLOAT16: "bfloat16"}
_GQA_ATTRIBUTES = ("num_heads", "kv_num_heads", "scale", "softcap", "local_window_size", "smooth_softmax")


@dataclass(frozen=True)
class GatedAttentionConfig:
    num_heads: int = 4
    kv_num_heads: int = 2
    head_size: int = 16
    rotary_dim: int = 8  # rotary_embedding_dim (0: the head size)
    mrope_section: tuple = (2, 1, 1)
    mrope_layout: int = 1
    epsilon: float = 1e-6
    scale: float = 0.0  # 0: 1/sqrt(head_size)
    dtype: str = "float32"

    def attributes(self) -> dict:
        return {"num_heads": self.num_heads, "kv_num_heads": self.kv_num_heads, "scale": float(self.scale),
                "epsilon": float(self.epsilon), "rotary_embedding_dim": self.rotary_dim,
                "mrope_section": list(self.mrope_section), "mrope_layout": self.mrope_layout}

    @property
    def qkv_width(self) -> int:
        return 2 * (self.num_heads + self.kv_num_heads) * self.head_size


def stream_of_column(cfg: GatedAttentionConfig) -> np.ndarray:
    """Which position stream (0 t, 1 h, 2 w) each cos/sin column takes (ORT's MRotaryEmbedding)."""
    half = (cfg.rotary_dim or cfg.head_size) // 2
    stream = np.zeros(half, np.int64)
    if cfg.mrope_layout == 0:
        stream[:] = np.repeat([0, 1, 2], cfg.mrope_section)[:half]
    else:
        for dim in (1, 2):
            stream[dim:min(3 * cfg.mrope_section[dim], half):3] = dim
    return stream


def reference(cfg: GatedAttentionConfig, qkv, past_key, past_value, seqlens_k, total_sequence_length, position_ids,
              cos_cache, sin_cache, q_norm_weight, k_norm_weight, share_buffer: bool = False):
    """float64 reference of the op (no rounding between steps): (output, present_key, present_value)."""
    x = np.asarray(qkv, np.float64)
    B, S, _ = x.shape
    Nq, Nkv, H = cfg.num_heads, cfg.kv_num_heads, cfg.head_size
    rot = cfg.rotary_dim or H
    half = rot // 2
    qg = x[..., :2 * Nq * H].reshape(B, S, Nq, 2 * H)
    q, gate = qg[..., :H], qg[..., H:].reshape(B, S, Nq * H)
    k = x[..., 2 * Nq * H:2 * Nq * H + Nkv * H].reshape(B, S, Nkv, H)
    v = x[..., 2 * Nq * H + Nkv * H:]
    streams = stream_of_column(cfg)
    pos = np.asarray(position_ids)[streams]  # [half, B, S]
    cos = np.asarray(cos_cache, np.float64)[pos, np.arange(half)[:, None, None]].transpose(1, 2, 0)[:, :, None]
    sin = np.asarray(sin_cache, np.float64)[pos, np.arange(half)[:, None, None]].transpose(1, 2, 0)[:, :, None]

    def norm_rope(t, w):
        n = t / np.sqrt(np.mean(t * t, axis=-1, keepdims=True) + cfg.epsilon) * np.asarray(w, np.float64)
        out = n.copy()
        a, b = n[..., :half], n[..., half:rot]
        out[..., :half] = a * cos - b * sin
        out[..., half:rot] = b * cos + a * sin
        return out

    qr = norm_rope(q, q_norm_weight).reshape(B, S, Nq * H)
    kr = norm_rope(k, k_norm_weight).reshape(B, S, Nkv * H)
    gqa = GqaConfig(num_heads=Nq, kv_num_heads=Nkv, head_size=H, scale=cfg.scale)
    attn, pk, pv = gqa_reference(gqa, qr, kr, v, past_key, past_value, seqlens_k, total_sequence_length,
                                 share_buffer=share_buffer)
    return attn / (1.0 + np.exp(-gate)), pk, pv


def random_case(rng: np.random.Generator, cfg: GatedAttentionConfig, batch: int, seq: int, past: int, buffer: int,
                max_position: int = 64):
    """Inputs of one call (float32 / float16 by cfg.dtype): `past` cached positions in a `buffer`-long
    cache, `seq` new tokens at positions past .. past + seq - 1 (the three MRoPE streams given distinct
    offsets, so a wrong stream assignment shows), cos/sin caches of `max_position` rows."""
    t = {"float32": np.float32, "float16": np.float16}[cfg.dtype]
    Nkv, H = cfg.kv_num_heads, cfg.head_size
    half = (cfg.rotary_dim or H) // 2
    base = np.arange(past, past + seq)
    positions = np.stack([base, base + 3, base + 7])[:, None, :].repeat(batch, axis=1).astype(np.int64)
    angles = np.arange(max_position)[:, None] * (10000.0 ** (-np.arange(half) / half))[None, :]
    return {
        "qkv": (rng.standard_normal((batch, seq, cfg.qkv_width)) * 2).astype(t),
        "past_key": rng.standard_normal((batch, Nkv, buffer, H)).astype(t),
        "past_value": rng.standard_normal((batch, Nkv, buffer, H)).astype(t),
        "seqlens_k": np.full(batch, past + seq - 1, np.int32),
        "total_sequence_length": np.array(past + seq, np.int32),
        "position_ids": positions,
        "cos_cache": np.cos(angles).astype(np.float32),
        "sin_cache": np.sin(angles).astype(np.float32),
        "q_norm_weight": (1 + 0.1 * rng.standard_normal(H)).astype(t),
        "k_norm_weight": (1 + 0.1 * rng.standard_normal(H)).astype(t),
    }


def _value_infos(cfg: GatedAttentionConfig, t: int):
    from onnx import TensorProto, helper

    Nq, Nkv, H = cfg.num_heads, cfg.kv_num_heads, cfg.head_size
    half = (cfg.rotary_dim or H) // 2
    inputs = [helper.make_tensor_value_info("qkv", t, ["B", "S", "qkv_width"]),
              helper.make_tensor_value_info("past_key", t, ["B", Nkv, "P", H]),
              helper.make_tensor_value_info("past_value", t, ["B", Nkv, "P", H]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, [3, "B", "S"]),
              helper.make_tensor_value_info("cos_cache", TensorProto.FLOAT, ["max_position", half]),
              helper.make_tensor_value_info("sin_cache", TensorProto.FLOAT, ["max_position", half]),
              helper.make_tensor_value_info("q_norm_weight", t, ["head_size"]),
              helper.make_tensor_value_info("k_norm_weight", t, ["head_size"])]
    outputs = [helper.make_tensor_value_info("output", t, ["B", "S", Nq * H]),
               helper.make_tensor_value_info("present_key", t, ["B", Nkv, "L", H]),
               helper.make_tensor_value_info("present_value", t, ["B", Nkv, "L", H])]
    return inputs, outputs


def model(cfg: GatedAttentionConfig, node_name: str = "/model/layers.3/attn/GatedAttention",
          attributes: dict | None = None):
    """A one-node model of the op: every input extent but the heads' symbolic (so the op's own checks are
    the ones that see a bad shape)."""
    from onnx import TensorProto, helper

    t = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}[cfg.dtype]
    inputs, outputs = _value_infos(cfg, t)
    node = helper.make_node(OP, list(INPUTS), list(OUTPUTS), name=node_name, domain=DOMAIN,
                            **(cfg.attributes() if attributes is None else attributes))
    graph = helper.make_graph([node], "gated_attention", inputs, outputs)
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                  helper.make_opsetid(DOMAIN, 1)])


def builder_model(cfg: GatedAttentionConfig, gqa_domain: str = DOMAIN, base: str = "/model/layers.3/attn"):
    """The same mixer as the builder's nodes (module docstring; float16: the rotary between casts), graph
    inputs and outputs as model()'s: what the rewrite fuses, and the nodes the op is checked against."""
    from onnx import TensorProto, helper, numpy_helper

    t = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[cfg.dtype]
    inputs, outputs = _value_infos(cfg, t)
    Nq, Nkv, H = cfg.num_heads, cfg.kv_num_heads, cfg.head_size
    inits = []

    def const(name, values):
        inits.append(numpy_helper.from_array(np.asarray(values, np.int64), f"{base}/{name}"))
        return f"{base}/{name}"

    nodes = [
        helper.make_node("Split", ["qkv", const("qkv_sizes", [2 * Nq * H, Nkv * H, Nkv * H])],
                         ["q_gate", "k", "v"], name=f"{base}/qkv_proj/Split", axis=-1),
        helper.make_node("Reshape", ["q_gate", const("qg_shape", [0, 0, Nq, 2 * H])], ["qg"], name=f"{base}/q_gate/Reshape"),
        helper.make_node("Split", ["qg", const("qg_sizes", [H, H])], ["q4", "g4"], name=f"{base}/q_gate/Split", axis=-1),
        helper.make_node("Reshape", ["q4", const("q_shape", [0, 0, Nq * H])], ["q"], name=f"{base}/q_proj/Reshape"),
        helper.make_node("Reshape", ["g4", const("g_shape", [0, 0, Nq * H])], ["gate"], name=f"{base}/gate/Reshape"),
    ]
    rope = {"interleaved": 0, "rotary_embedding_dim": cfg.rotary_dim, "mrope_section": list(cfg.mrope_section),
            "mrope_layout": cfg.mrope_layout, "is_packed_batching": 0}
    cast = t != TensorProto.FLOAT  # the rotary in float32 between casts, as the builder writes 16-bit graphs
    for which, src, heads in (("q", "q", Nq), ("k", "k", Nkv)):
        rope_in, rope_out = (f"{which}_norm_f", f"{which}_rot_f") if cast else (f"{which}_norm", f"{which}_rot")
        nodes += [
            helper.make_node("Reshape", [src, const(f"{which}_flat", [0, -1, H])], [f"{which}_flat"],
                             name=f"{base}/{which}_norm/Reshape_1"),
            helper.make_node("SimplifiedLayerNormalization", [f"{which}_flat", f"{which}_norm_weight"],
                             [f"{which}_normed"], name=f"{base}/{which}_norm/SimplifiedLayerNormalization",
                             epsilon=float(cfg.epsilon), axis=-1, stash_type=1),
            helper.make_node("Reshape", [f"{which}_normed", const(f"{which}_unflat", [0, -1, heads * H])],
                             [f"{which}_norm"], name=f"{base}/{which}_norm/Reshape_2"),
        ]
        if cast:
            nodes.append(helper.make_node("Cast", [f"{which}_norm"], [rope_in], name=f"{base}/{which}_rotary/Cast_in",
                                          to=TensorProto.FLOAT))
        nodes.append(helper.make_node("MRotaryEmbedding", [rope_in, "position_ids", "cos_cache", "sin_cache"],
                                      [rope_out], name=f"{base}/{which}_rotary/MRotaryEmbedding", domain=MS,
                                      num_heads=heads, **rope))
        if cast:
            nodes.append(helper.make_node("Cast", [rope_out], [f"{which}_rot"], name=f"{base}/{which}_rotary/Cast_out",
                                          to=t))
    gqa_attrs = {"num_heads": Nq, "kv_num_heads": Nkv, "scale": float(cfg.scale)}
    nodes += [
        helper.make_node(GQA, ["q_rot", "k_rot", "v", "past_key", "past_value", "seqlens_k", "total_sequence_length"],
                         ["attn", "present_key", "present_value"], name=f"{base}/GroupQueryAttention",
                         domain=gqa_domain, **gqa_attrs),
        helper.make_node("Sigmoid", ["gate"], ["gate_sig"], name=f"{base}/gate/Sigmoid"),
        helper.make_node("Mul", ["attn", "gate_sig"], ["output"], name=f"{base}/gate/Mul"),
    ]
    known = {vi.name for vi in inputs + outputs}
    value_info = [helper.make_tensor_value_info(o, TensorProto.FLOAT if o.endswith("_f") else t, None)
                  for node in nodes for o in node.output if o not in known]
    graph = helper.make_graph(nodes, "gated_attention_nodes", inputs, outputs, initializer=inits, value_info=value_info)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(MS, 1), helper.make_opsetid(DOMAIN, 1)]
    return helper.make_model(graph, ir_version=10, opset_imports=opsets)


# --------------------------------------------------------------------------------------------------
# The rewrite


def _mixer(op, cast, qkv, qkv_sizes, qg_shape, qg_sizes, q_shape, g_shape, q_flat_shape, q_norm_weight,
           q_unflat_shape, k_flat_shape, k_norm_weight, k_unflat_shape, position_ids, cos_cache, sin_cache, past_key,
           past_value, seqlens_k, total_sequence_length):
    q_gate, k, v = op.Split(qkv, qkv_sizes, _outputs=["q_gate", "k", "v"])
    q4, g4 = op.Split(op.Reshape(q_gate, qg_shape, _outputs=["qg"]), qg_sizes, _outputs=["q4", "g4"])
    q = op.Reshape(q4, q_shape, _outputs=["q"])
    gate = op.Reshape(g4, g_shape, _outputs=["gate"])
    rotated = {}
    for which, x, flat, weight, unflat in (("q", q, q_flat_shape, q_norm_weight, q_unflat_shape),
                                           ("k", k, k_flat_shape, k_norm_weight, k_unflat_shape)):
        normed = op.SimplifiedLayerNormalization(op.Reshape(x, flat, _outputs=[f"{which}_flat"]), weight,
                                                 _outputs=[f"{which}_normed"])
        unflat_value = op.Reshape(normed, unflat, _outputs=[f"{which}_norm"])
        if cast:  # a 16-bit graph runs the rotary in float32 between two casts (models/graph.py, the builder)
            rope_in = op.Cast(unflat_value, _outputs=[f"{which}_cast_in"])
            rope = op.MRotaryEmbedding(rope_in, position_ids, cos_cache, sin_cache, _domain=MS,
                                       _outputs=[f"{which}_rope"])
            rotated[which] = op.Cast(rope, _outputs=[f"{which}_rot"])
        else:
            rotated[which] = op.MRotaryEmbedding(unflat_value, position_ids, cos_cache, sin_cache, _domain=MS,
                                                 _outputs=[f"{which}_rot"])
    attn, present_key, present_value = op.GroupQueryAttention(
        rotated["q"], rotated["k"], v, past_key, past_value, seqlens_k, total_sequence_length, _domain=DOMAIN,
        _outputs=["attn", "present_key", "present_value"])
    y = op.Mul(attn, op.Sigmoid(gate, _outputs=["gate_sig"]), _outputs=["y"])
    return y, present_key, present_value


def _pattern(op, qkv, qkv_sizes, qg_shape, qg_sizes, q_shape, g_shape, q_flat_shape, q_norm_weight, q_unflat_shape,
             k_flat_shape, k_norm_weight, k_unflat_shape, position_ids, cos_cache, sin_cache, past_key, past_value,
             seqlens_k, total_sequence_length):
    return _mixer(op, False, qkv, qkv_sizes, qg_shape, qg_sizes, q_shape, g_shape, q_flat_shape, q_norm_weight,
                  q_unflat_shape, k_flat_shape, k_norm_weight, k_unflat_shape, position_ids, cos_cache, sin_cache,
                  past_key, past_value, seqlens_k, total_sequence_length)


def _pattern_cast(op, qkv, qkv_sizes, qg_shape, qg_sizes, q_shape, g_shape, q_flat_shape, q_norm_weight,
                  q_unflat_shape, k_flat_shape, k_norm_weight, k_unflat_shape, position_ids, cos_cache, sin_cache,
                  past_key, past_value, seqlens_k, total_sequence_length):
    return _mixer(op, True, qkv, qkv_sizes, qg_shape, qg_sizes, q_shape, g_shape, q_flat_shape, q_norm_weight,
                  q_unflat_shape, k_flat_shape, k_norm_weight, k_unflat_shape, position_ids, cos_cache, sin_cache,
                  past_key, past_value, seqlens_k, total_sequence_length)


class GatedAttentionRewrite(Rewrite):
    """Every gated attention mixer our op runs becomes one ort_mtp GatedAttention (module docstring).
    available(dtype) -> None | reason, if given, is asked with qkv's element type."""

    name = GATED_ATTENTION

    def __init__(self, available=None):
        super().__init__(available)
        self._planned: dict[ir.Node, dict] = {}

    def rules(self) -> list[RewriteRule]:
        # commute: the gate's Mul either way round
        plain = RewriteRule(_pattern, self._replacement, self._check, name="GatedAttentionMixer")
        cast = RewriteRule(_pattern_cast, self._replacement, self._check, name="GatedAttentionMixerRotaryCast")
        return [*plain.commute(), *cast.commute()]

    def is_candidate(self, node: ir.Node) -> bool:
        return node.op_type == GQA and node.domain == DOMAIN

    def unmatched_reason(self, candidate: ir.Node) -> str:
        return ("it is not a gated attention mixer (split q|gate, k, v of one projection, per-head norms, "
                "MRotaryEmbedding, the output times sigmoid(gate))")

    def block_outputs(self, root, match):
        return {match.bindings[k] for k in ("y", "present_key", "present_value") if match.bindings.get(k) is not None}

    @check
    def _check(self, context, **v) -> bool:
        n = {key: v[key].producer() for key in ("q_gate", "qg", "q4", "q", "gate", "q_flat", "q_normed", "q_norm",
                                                 "q_rot", "k_flat", "k_normed", "k_norm", "k_rot", "attn")}
        for which in ("q", "k"):  # the MRotaryEmbedding node, and the casts around it where there are some
            rope = v.get(f"{which}_rope")
            n[f"{which}_casts"] = (v[f"{which}_cast_in"].producer(), n[f"{which}_rot"]) if rope is not None else ()
            if rope is not None:
                n[f"{which}_rot"] = rope.producer()
        gqa = n["attn"]
        self.require_selected(gqa)
        self._planned[context.root] = self._attributes(n, v)
        return True

    def _attributes(self, n: dict, v: dict) -> dict:
        gqa = n["attn"]
        extra = unknown_attributes(gqa, _GQA_ATTRIBUTES + ("do_rotary", "rotary_interleaved"))
        if extra:
            raise PatternMismatch(gqa, f"attribute {extra[0]!r} is not supported")
        if attribute(gqa, "do_rotary", 0) != 0:  # ours refuses it at load anyway
            raise PatternMismatch(gqa, "do_rotary=1 is not supported")
        nq, nkv = attribute(gqa, "num_heads"), attribute(gqa, "kv_num_heads")
        split = n["q_gate"]
        for node, known in ((split, ("axis",)), (n["q4"], ("axis",)), (n["qg"], ("allowzero",)), (n["q"], ("allowzero",)),
                            (n["gate"], ("allowzero",))):
            bad = unknown_attributes(node, known)
            if bad:
                raise PatternMismatch(node, f"attribute {bad[0]!r} is not supported")
        if attribute(split, "axis", 0) not in (-1, 2):
            raise PatternMismatch(split, f"axis={attribute(split, 'axis', 0)} is not the last axis")
        sizes = [int(x) for x in np.ravel(small_constant(v["qkv_sizes"], "the split sizes", split))]
        if len(sizes) != 3 or sizes[1] != sizes[2] or sizes[1] <= 0 or sizes[1] % nkv:
            raise PatternMismatch(split, f"split sizes {sizes} are not [2 Nq H, Nkv H, Nkv H] for {nq} q heads "
                                         f"and {nkv} kv heads")
        H = sizes[1] // nkv
        if sizes[0] != 2 * nq * H:
            raise PatternMismatch(split, f"split sizes {sizes} are not [2 Nq H, Nkv H, Nkv H] for {nq} q heads "
                                         f"and {nkv} kv heads")
        if attribute(n["q4"], "axis", 0) not in (-1, 3):
            raise PatternMismatch(n["q4"], f"axis={attribute(n['q4'], 'axis', 0)} is not the last axis")
        halves = [int(x) for x in np.ravel(small_constant(v["qg_sizes"], "the q/gate split sizes", n["q4"]))]
        if halves != [H, H]:
            raise PatternMismatch(n["q4"], f"split sizes {halves} are not [{H}, {H}]")
        check_reshape(n["qg"], v["qg_shape"], [nq, 2 * H])
        check_reshape(n["q"], v["q_shape"], [nq * H])
        check_reshape(n["gate"], v["g_shape"], [nq * H])

        norms, ropes = [], []
        for which, heads in (("q", nq), ("k", nkv)):
            for node in (n[f"{which}_flat"], n[f"{which}_norm"]):
                if attribute(node, "allowzero", 0) != 0:
                    raise PatternMismatch(node, "allowzero=1 is not supported")
            check_reshape(n[f"{which}_flat"], v[f"{which}_flat_shape"], [H])
            check_reshape(n[f"{which}_norm"], v[f"{which}_unflat_shape"], [heads * H])
            norm = n[f"{which}_normed"]
            bad = unknown_attributes(norm, ("epsilon", "axis", "stash_type"))
            if bad:
                raise PatternMismatch(norm, f"attribute {bad[0]!r} is not supported")
            if attribute(norm, "axis", -1) not in (-1, 2):
                raise PatternMismatch(norm, f"axis={attribute(norm, 'axis')} is not the head's features")
            if attribute(norm, "stash_type", 1) != 1:
                raise PatternMismatch(norm, "stash_type other than 1 (float) is not supported")
            weight = dims(v[f"{which}_norm_weight"])
            if weight is not None and (len(weight) != 1 or weight[0] not in (None, H)):
                raise PatternMismatch(norm, f"the norm weight has shape {weight}, expected [{H}]")
            norms.append(float(attribute(norm, "epsilon", 1e-5)))
            rope = n[f"{which}_rot"]
            bad = unknown_attributes(rope, ("interleaved", "rotary_embedding_dim", "num_heads", "mrope_section",
                                            "mrope_layout", "is_packed_batching", "scale"))
            if bad:
                raise PatternMismatch(rope, f"attribute {bad[0]!r} is not supported")
            if attribute(rope, "interleaved", 0) != 0:
                raise PatternMismatch(rope, "interleaved=1 is not supported")
            if attribute(rope, "is_packed_batching", 0) != 0:
                raise PatternMismatch(rope, "is_packed_batching=1 is not supported")
            if float(attribute(rope, "scale", 1.0)) != 1.0:
                raise PatternMismatch(rope, f"scale={attribute(rope, 'scale')} is not supported (1)")
            if attribute(rope, "num_heads", heads) != heads:
                raise PatternMismatch(rope, f"num_heads={attribute(rope, 'num_heads')} is not {heads}")
            ropes.append((attribute(rope, "rotary_embedding_dim", 0), attribute(rope, "mrope_section"),
                          attribute(rope, "mrope_layout", 0)))
        if norms[0] != norms[1]:
            raise PatternMismatch(n["k_normed"], f"epsilon {norms[1]} differs from the q norm's {norms[0]}")
        if ropes[0] != ropes[1]:
            raise PatternMismatch(n["k_rot"], "its rotary attributes differ from the q rotary's")
        rot, section, layout = ropes[0]
        if not isinstance(section, list) or len(section) != 3:
            raise PatternMismatch(n["q_rot"], f"mrope_section {section} does not hold 3 values")
        if sum(section) != (rot or H) // 2:
            raise PatternMismatch(n["q_rot"], f"mrope_section {section} does not sum to {(rot or H) // 2}")
        dtype = v["qkv"].dtype
        if dtype not in _TYPES:
            raise PatternMismatch(split, f"qkv has type {dtype}, not float32, float16 or bfloat16")
        for key in ("cos_cache", "sin_cache"):
            if v[key].dtype not in (None, ir.DataType.FLOAT):
                raise PatternMismatch(n["q_rot"], f"{key} ({v[key].name}) is {v[key].dtype}, not float32")
        for which in ("q", "k"):
            casts = n[f"{which}_casts"]
            if casts:
                cast_in, cast_out = casts
                if attribute(cast_in, "to") != ir.DataType.FLOAT or attribute(cast_out, "to") != dtype:
                    raise PatternMismatch(cast_in, f"the casts around the rotary are not to float32 and back to "
                                                   f"qkv's {_TYPES[dtype]}")
            elif n[f"{which}_rot"].inputs[0].dtype not in (None, dtype):
                raise PatternMismatch(n[f"{which}_rot"], "the rotary runs in another type than qkv's")
        self.require_available(dtype)
        attrs = {name: attribute(gqa, name) for name in _GQA_ATTRIBUTES if name in gqa.attributes}
        attrs.update(epsilon=norms[0], rotary_embedding_dim=int(rot), mrope_section=[int(x) for x in section],
                     mrope_layout=int(layout))
        return attrs

    def _replacement(self, op, qkv, past_key, past_value, seqlens_k, total_sequence_length, position_ids, cos_cache,
                     sin_cache, q_norm_weight, k_norm_weight, y, attn, **_):
        attrs = self._planned.pop(y.producer())
        gqa = attn.producer()
        name = gqa.name[: -len(GQA)] + OP if gqa.name.endswith(GQA) else f"{label(gqa)}/{OP}"
        outputs = op.op(OP, qkv, past_key, past_value, seqlens_k, total_sequence_length, position_ids, cos_cache,
                        sin_cache, q_norm_weight, k_norm_weight, _domain=DOMAIN, _outputs=3, _name=name, **attrs)
        outputs[0].producer().doc_string = gqa.doc_string
        return list(outputs)


def _probe_model(name: str):
    return model(GatedAttentionConfig(dtype=name), node_name="probe")


def available(library: str, provider: str = "cpu", dtype: ir.DataType = ir.DataType.FLOAT,
              device_id: int = 0) -> str | None:
    """None when `library` runs ort_mtp::GatedAttention on `provider` for `dtype`, else why not (one line;
    a one-node session, cached per library file)."""
    return probe.by_type(OP, library, provider, dtype, _TYPES, _probe_model, device_id)
