"""ort_mtp::GroupQueryAttention: its float64 reference, and one-node models of it and of ONNX Runtime's
com.microsoft::GroupQueryAttention (for the tests, the benchmarks and the availability probe).

The op is a drop-in for com.microsoft::GroupQueryAttention as onnxruntime-genai's builder emits it
(csrc/attention/group_query_attention.h): query [B, S, Nq * H], key and value [B, S, Nkv * H] with
rotary already applied, past_key / past_value [B, Nkv, P, H], seqlens_k [B] (int32, total length - 1)
and total_sequence_length (int32 scalar) -> output [B, S, Nq * H], present_key / present_value
[B, Nkv, max(total, P), H]. Batch row b's new tokens sit at positions past_b = seqlens_k[b] + 1 - S ..
seqlens_k[b]; query row s attends causally to positions [0, past_b + s] (or the last
local_window_size of them, its own included: ONNX Runtime 1.31's
CPU kernel, measured) of its kv head h // (Nq / Nkv), scores scaled by `scale` (0: 1/sqrt(H)),
optionally soft-capped, softmax, times V.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import DOMAIN

OP = "GroupQueryAttention"
SOURCE_DOMAIN = "com.microsoft"
INPUTS = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length")
OUTPUTS = ("output", "present_key", "present_value")
_NP = {"float32": np.float32, "float16": np.float16}


@dataclass(frozen=True)
class GqaConfig:
    num_heads: int = 4
    kv_num_heads: int = 2
    head_size: int = 16
    scale: float = 0.0  # 0: 1/sqrt(head_size)
    softcap: float = 0.0
    local_window_size: int = -1
    dtype: str = "float32"  # float32 or float16 (random_case; model() also bfloat16, which ORT's CPU GQA lacks)

    def attributes(self) -> dict:
        attrs = {"num_heads": self.num_heads, "kv_num_heads": self.kv_num_heads, "scale": float(self.scale)}
        if self.softcap:
            attrs["softcap"] = float(self.softcap)
        if self.local_window_size != -1:
            attrs["local_window_size"] = int(self.local_window_size)
        return attrs


def reference(cfg: GqaConfig, query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
              share_buffer: bool = False):
    """float64 reference of the op: (output, present_key, present_value) as float64 arrays (present as
    the op leaves it: past's first past_b rows, the new rows, zeros after them unless share_buffer, where
    the rest of past's buffer is kept)."""
    q, k, v = (np.asarray(x, np.float64) for x in (query, key, value))
    pk, pv = np.asarray(past_key, np.float64), np.asarray(past_value, np.float64)
    B, S, _ = q.shape
    Nq, Nkv, H = cfg.num_heads, cfg.kv_num_heads, cfg.head_size
    P = pk.shape[2]
    L = max(int(np.ravel(total_sequence_length)[0]), P)
    if share_buffer:
        present_k, present_v = pk.copy(), pv.copy()
    else:
        present_k, present_v = np.zeros((B, Nkv, L, H)), np.zeros((B, Nkv, L, H))
    scale = cfg.scale or float(np.float32(1.0) / np.sqrt(np.float32(H)))
    out = np.zeros((B, S, Nq * H))
    for b in range(B):
        past = int(seqlens_k[b]) + 1 - S
        if not share_buffer:
            present_k[b, :, :past] = pk[b, :, :past]
            present_v[b, :, :past] = pv[b, :, :past]
        present_k[b, :, past:past + S] = k[b].reshape(S, Nkv, H).transpose(1, 0, 2)
        present_v[b, :, past:past + S] = v[b].reshape(S, Nkv, H).transpose(1, 0, 2)
        for h in range(Nq):
            kvh = h // (Nq // Nkv)
            for s in range(S):
                last = past + s
                first = last + 1 - cfg.local_window_size if 0 < cfg.local_window_size < last + 1 else 0
                scores = present_k[b, kvh, first:last + 1] @ q[b, s, h * H:(h + 1) * H] * scale
                if cfg.softcap > 0:
                    scores = cfg.softcap * np.tanh(scores / cfg.softcap)
                e = np.exp(scores - scores.max())
                out[b, s, h * H:(h + 1) * H] = (e @ present_v[b, kvh, first:last + 1]) / e.sum()
    return out, present_k, present_v


def random_case(rng: np.random.Generator, cfg: GqaConfig, batch: int, seq: int, past: int, buffer: int):
    """Inputs of one call: `past` cached positions (random, as earlier calls would have left them) in a
    buffer of `buffer` positions (positions past `past` hold garbage the op must not read), `seq` new
    tokens; seqlens_k = past + seq - 1 for every batch row and total_sequence_length = past + seq."""
    t = _NP[cfg.dtype]
    Nq, Nkv, H = cfg.num_heads, cfg.kv_num_heads, cfg.head_size
    return {
        "query": rng.standard_normal((batch, seq, Nq * H)).astype(t),
        "key": rng.standard_normal((batch, seq, Nkv * H)).astype(t),
        "value": rng.standard_normal((batch, seq, Nkv * H)).astype(t),
        "past_key": rng.standard_normal((batch, Nkv, buffer, H)).astype(t),
        "past_value": rng.standard_normal((batch, Nkv, buffer, H)).astype(t),
        "seqlens_k": np.full(batch, past + seq - 1, np.int32),
        "total_sequence_length": np.array(past + seq, np.int32),
    }


def model(cfg: GqaConfig, domain: str = DOMAIN, node_name: str = "/model/layers.0/attn/GroupQueryAttention",
          attributes: dict | None = None, symbolic: bool = False, input_dtypes: dict | None = None,
          output_dtypes: dict | None = None):
    """A one-node model of the op (domain ort_mtp) or of ORT's (com.microsoft): batch, length and cache
    extents symbolic, head extents fixed by cfg (symbolic=True: every extent symbolic, so that the op's
    own checks are the ones that see a bad shape). input_dtypes / output_dtypes: {name: numpy dtype
    name} overrides of declared element types."""
    from onnx import TensorProto, helper

    t = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}[cfg.dtype]
    Nq, Nkv, H = cfg.num_heads, cfg.kv_num_heads, cfg.head_size
    inputs = [helper.make_tensor_value_info("query", t, ["B", "S", Nq * H]),
              helper.make_tensor_value_info("key", t, ["B", "S", Nkv * H]),
              helper.make_tensor_value_info("value", t, ["B", "S", Nkv * H]),
              helper.make_tensor_value_info("past_key", t, ["B", Nkv, "P", H]),
              helper.make_tensor_value_info("past_value", t, ["B", Nkv, "P", H]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    outputs = [helper.make_tensor_value_info("output", t, ["B", "S", Nq * H]),
               helper.make_tensor_value_info("present_key", t, ["B", Nkv, "L", H]),
               helper.make_tensor_value_info("present_value", t, ["B", Nkv, "L", H])]
    from onnx import helper as h

    for vi in inputs + outputs:
        override = {**(input_dtypes or {}), **(output_dtypes or {})}.get(vi.name)
        if override is not None:
            vi.type.tensor_type.elem_type = h.np_dtype_to_tensor_dtype(np.dtype(override))
        if symbolic:
            for i, dim in enumerate(vi.type.tensor_type.shape.dim):
                dim.dim_param = f"{vi.name}_{i}"
    attrs = cfg.attributes() if attributes is None else attributes
    node = helper.make_node(OP, list(INPUTS), list(OUTPUTS), name=node_name, domain=domain, **attrs)
    graph = helper.make_graph([node], "group_query_attention", inputs, outputs)
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                  helper.make_opsetid(domain, 1)])


