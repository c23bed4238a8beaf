"""The Qwen3.5 decoder and MTP-head graphs, node for node as onnxruntime-genai 0.18's builder emits
them for model_type qwen3_5_text (builders/qwen.py: Qwen35TextModel, Qwen35DenseMTPModel).

Same op types, node and value names, attributes, graph I/O and value_info; only the weights differ
(synthetic, see weights.py). tests/test_models_builder_parity.py compares a build with the builder's own
output for a random checkpoint of the same shape.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .config import BuildOptions, Qwen35Shape
from .onnx_writer import DTYPES, IO_DTYPE, ExternalData, GraphWriter
from .weights import Int4Matrix, Normal, Uniform, dequantize, float_chunks, ordered_map

MS = "com.microsoft"
BATCH_SEQ = ["batch_size", "sequence_length"]


def const(dtype: str, value) -> str:
    """Name of a builder constant, e.g. /model/constants/INT64/[0, 0, 128]."""
    return f"/model/constants/{dtype}/{value}"


class Emitter:
    """Emits nodes and their initializers into one GraphWriter, the way the builder names them."""

    def __init__(
        self,
        shape: Qwen35Shape,
        options: BuildOptions,
        writer: GraphWriter,
        pool: ThreadPoolExecutor | None,
        stream_prefix: str = "",
        shared_from: ExternalData | None = None,
    ):
        self.shape = shape
        self.options = options
        self.w = writer
        self.pool = pool
        self.io = IO_DTYPE[options.io_dtype]
        self.seed = options.synthesis.seed
        # Random streams are keyed by prefix + initializer name: the MTP graph reuses names such as
        # model.layers.0.* for its own layer, so its streams get a prefix to stay independent.
        self.stream_prefix = stream_prefix
        # Initializers this graph shares with the main model (embedding, lm_head): referenced from
        # model.onnx.data instead of written again, as the builder's share_initializers leaves them.
        self.shared_from = shared_from
        self.shared_names = {"model.embed_tokens.weight"}
        self.eps = float(np.float32(shape.rms_norm_eps))

    # ---------------------------------------------------------------- initializers
    def _shared(self, name: str, dtype: str, dims) -> bool:
        if self.shared_from is not None and (name in self.shared_names or name.startswith("lm_head.MatMul.")):
            self.w.reference_initializer(name, dtype, dims, self.shared_from)
            return True
        return False

    def float_init(self, name: str, spec: Normal | Uniform, dtype: str | None = None) -> str:
        dtype = dtype or self.io
        if not self._shared(name, dtype, spec.shape):
            chunks = float_chunks(spec, self.seed, self.stream_prefix + name, DTYPES[dtype][0], self.pool)
            self.w.add_initializer(name, dtype, spec.shape, chunks)
        return name

    def array_init(self, name: str, values: np.ndarray, dtype: str | None = None) -> str:
        dtype = dtype or self.io
        self.w.add_initializer(name, dtype, values.shape, [values.astype(DTYPES[dtype][0])])
        return name

    def norm_weight(self, name: str, size: int, jitter: bool = True) -> str:
        """RMSNorm weight with the builder's +1 offset already applied: 1 (+ jitter)."""
        std = self.options.synthesis.norm_jitter if jitter else 0.0
        return self.float_init(name, Normal((size,), std=std, mean=1.0))

    # ---------------------------------------------------------------- MatMul / MatMulNBits
    def matmul(self, basename: str, root_input: str, spec: Int4Matrix, output: str | None = None) -> str:
        """A projection y = x W^T with W [N, K]. int4: MatMulNBits over B [N, K/32, 16] + scales;
        fp16/fp32: MatMul over the exact dequantization stored [K, N]."""
        weight = basename[1:].replace("/", ".")  # /model/layers.0/mlp/up_proj/MatMul -> model.layers.0...
        output = output or f"{basename}/output_0"
        if self.options.precision == "int4":
            q4, scales = f"{weight}.weight_Q4", f"{weight}.weight_scales"
            self._int4_initializers(q4, scales, spec)
            attrs = {"K": spec.k, "N": spec.n}
            if self.options.int4_accuracy_level is not None:
                attrs["accuracy_level"] = self.options.int4_accuracy_level
            attrs.update(bits=4, block_size=spec.block)
            self.w.node("MatMulNBits", [root_input, q4, scales], [output], f"{basename}_Q4", MS, **attrs)
        else:
            name = f"{weight}.weight"
            if not self._shared(name, self.io, [spec.k, spec.n]):
                dense = self._dequantized(spec, self.stream_prefix + name)
                self.w.add_initializer(name, self.io, [spec.k, spec.n], [dense.T.astype(DTYPES[self.io][0])])
            self.w.node("MatMul", [root_input, name], [output], basename)
        return output

    def _int4_initializers(self, q4: str, scales_name: str, spec: Int4Matrix) -> None:
        q4_dims = [spec.n, spec.blocks, spec.block // 2]
        if self._shared(q4, "UINT8", q4_dims):
            self._shared(scales_name, self.io, [spec.n, spec.blocks])
            return
        stream = self.stream_prefix + q4
        scales: list[np.ndarray] = []

        def packed_chunks():
            for packed, chunk_scales in ordered_map(
                lambda i: spec.chunk(self.seed, stream, i), len(spec.chunk_ranges()), self.pool
            ):
                scales.append(chunk_scales)
                yield packed

        self.w.add_initializer(q4, "UINT8", q4_dims, packed_chunks())
        self.w.add_initializer(
            scales_name, self.io, [spec.n, spec.blocks], (s.astype(DTYPES[self.io][0], copy=False) for s in scales)
        )

    def _dequantized(self, spec: Int4Matrix, stream_name: str) -> np.ndarray:
        # The stream is keyed by the Q4 name so that an fp build draws the same values as int4.
        stream = stream_name.removesuffix(".weight") + ".weight_Q4"
        parts = ordered_map(
            lambda i: dequantize(*spec.chunk(self.seed, stream, i)), len(spec.chunk_ranges()), self.pool
        )
        return np.concatenate(list(parts), axis=0)

    def int4_spec(self, n: int, k: int, std_scale: float = 1.0, **kw) -> Int4Matrix:
        """N x K matrix with std std_scale/sqrt(K): every random path scaled by 1/sqrt(fan_in)."""
        return Int4Matrix(n=n, k=k, std=std_scale / math.sqrt(k), block=self.shape.block_size, **kw)

    def projection(self, basename: str, root: str, n: int, k: int, std_scale: float = 1.0) -> str:
        """A random K -> N projection of [B, S, K] activations; returns its [B, S, N] output."""
        return self.value(self.matmul(basename, root, self.int4_spec(n, k, std_scale)), self.hidden_shape(n))

    # ---------------------------------------------------------------- small node helpers
    def value(self, name: str, shape, dtype: str | None = None) -> str:
        self.w.value(name, dtype or self.io, shape)
        return name

    def hidden_shape(self, last: int | None = None) -> list:
        return [*BATCH_SEQ, self.shape.hidden_size if last is None else last]

    def simple_norm(self, name: str, root_input: str, weight: str, output: str) -> str:
        self.w.node(
            "SimplifiedLayerNormalization", [root_input, weight], [output], name,
            epsilon=self.eps, axis=-1, stash_type=1,
        )
        return output

    def skip_norm(self, name: str, residual: str, skip: str, weight: str, outputs: list[str]) -> None:
        self.w.node("SkipSimplifiedLayerNormalization", [residual, skip, weight], outputs, name, MS, epsilon=self.eps)

    def reshape(self, name: str, root_input: str, target: list[int], shape: list) -> str:
        output = f"{name}/output_0"
        self.w.node("Reshape", [root_input, const("INT64", target)], [output], name)
        return self.value(output, shape)

    # ---------------------------------------------------------------- shared subgraphs
    def attention_mask_reformat(self) -> tuple[str, str]:
        """seqlens_k = sum(mask) - 1 and total_sequence_length, both int32, for GroupQueryAttention."""
        base = "/model/attn_mask_reformat/attn_mask_subgraph"
        one_list, one = const("INT64", [1]), const("INT64", 1)
        self.w.node(
            "ReduceSum", ["attention_mask", one_list], [f"{base}/ReduceSum/output_0"], f"{base}/ReduceSum", keepdims=0
        )
        self.value(f"{base}/ReduceSum/output_0", ["batch_size"], "INT64")
        self.w.node("Sub", [f"{base}/ReduceSum/output_0", one_list], [f"{base}/Sub/output_0"], f"{base}/Sub")
        self.value(f"{base}/Sub/output_0", ["batch_size"], "INT64")
        self.w.node("Cast", [f"{base}/Sub/output_0"], [f"{base}/Sub/Cast/output_0"], f"{base}/Sub/Cast", to=6)
        self.value(f"{base}/Sub/Cast/output_0", ["batch_size"], "INT32")
        self.w.node("Shape", ["attention_mask"], [f"{base}/Shape/output_0"], f"{base}/Shape")
        self.value(f"{base}/Shape/output_0", [2], "INT64")
        self.w.node("Gather", [f"{base}/Shape/output_0", one], [f"{base}/Gather/output_0"], f"{base}/Gather", axis=0)
        self.value(f"{base}/Gather/output_0", [], "INT64")
        self.w.node("Cast", [f"{base}/Gather/output_0"], [f"{base}/Gather/Cast/output_0"], f"{base}/Gather/Cast", to=6)
        self.value(f"{base}/Gather/Cast/output_0", [], "INT32")
        return f"{base}/Sub/Cast/output_0", f"{base}/Gather/Cast/output_0"

    def embedding(self, basename: str) -> str:
        """Gather from model.embed_tokens.weight [V, H], N(0, 1): the residual stream's scale."""
        s = self.shape
        self.float_init("model.embed_tokens.weight", Normal((s.vocab_size, s.hidden_size), std=1.0))
        output = f"{basename}/Gather/output_0"
        self.w.node("Gather", ["model.embed_tokens.weight", "input_ids"], [output], f"{basename}/Gather")
        return self.value(output, self.hidden_shape())

    def rotary_caches(self) -> None:
        """cos/sin caches [context_length, rotary_dim/2] in fp32, exactly as the builder computes them."""
        if any(t.name == "cos_cache" for t in self.w.initializers):
            return
        s = self.shape
        exponents = np.arange(0, s.rotary_dim, 2, dtype=np.int64).astype(np.float32) / s.rotary_dim
        inv_freq = 1.0 / (s.rope_theta**exponents)
        freqs = np.outer(np.arange(s.context_length, dtype=np.float32), inv_freq.astype(np.float32))
        self.array_init("cos_cache", np.cos(freqs).astype(np.float32), "FLOAT")
        self.array_init("sin_cache", np.sin(freqs).astype(np.float32), "FLOAT")

    # ---------------------------------------------------------------- layers
    def input_layernorm(self, layer: int, root: str, residual: str | None, skip: str | None) -> tuple[str, str]:
        """Returns (normed, residual stream) for the layer's token mixer."""
        base = f"/model/layers.{layer}/input_layernorm"
        weight = self.norm_weight(f"model.layers.{layer}.input_layernorm.weight", self.shape.hidden_size)
        if skip is None:  # first layer: nothing to add yet
            out = self.simple_norm(f"{base}/LayerNorm", root, weight, f"{base}/output_0")
            return self.value(out, self.hidden_shape()), root
        outputs = [f"{base}/output_0", "", "", f"{base}/output_3"]
        self.skip_norm(f"{base}/SkipLayerNorm", residual, skip, weight, outputs)
        self.value(outputs[0], self.hidden_shape())
        self.value(outputs[3], self.hidden_shape())
        return outputs[0], outputs[3]

    def post_attention_layernorm(self, layer: int, residual: str, attn_out: str) -> tuple[str, str]:
        base = f"/model/layers.{layer}/post_attention_layernorm"
        weight = self.norm_weight(f"model.layers.{layer}.post_attention_layernorm.weight", self.shape.hidden_size)
        outputs = [f"{base}/output_0", "", "", f"{base}/output_3"]
        self.skip_norm(f"{base}/SkipLayerNorm", residual, attn_out, weight, outputs)
        self.value(outputs[0], self.hidden_shape())
        self.value(outputs[3], self.hidden_shape())
        return outputs[0], outputs[3]

    def mlp(self, layer: int, root: str) -> str:
        s, out_scale = self.shape, self.options.synthesis.out_scale
        base = f"/model/layers.{layer}/mlp"
        inter = self.hidden_shape(s.intermediate_size)
        gate = self.projection(f"{base}/gate_proj/MatMul", root, s.intermediate_size, s.hidden_size)
        up = self.projection(f"{base}/up_proj/MatMul", root, s.intermediate_size, s.hidden_size)
        self.w.node("Sigmoid", [gate], [f"{base}/act_fn/Sigmoid/output_0"], f"{base}/act_fn/Sigmoid")
        self.value(f"{base}/act_fn/Sigmoid/output_0", inter)
        silu = f"{base}/act_fn/Mul/output_0"
        self.w.node("Mul", [gate, f"{base}/act_fn/Sigmoid/output_0"], [silu], f"{base}/act_fn/Mul")
        self.value(silu, inter)
        self.w.node("Mul", [f"{base}/act_fn/Mul/output_0", up], [f"{base}/Mul/output_0"], f"{base}/Mul")
        self.value(f"{base}/Mul/output_0", inter)
        down = self.int4_spec(s.hidden_size, s.intermediate_size, std_scale=out_scale)
        return self.value(self.matmul(f"{base}/down_proj/MatMul", f"{base}/Mul/output_0", down), self.hidden_shape())

    def full_attention(self, layer: int, root: str, seqlens: str, total: str) -> str:
        """Gated GQA: packed q|gate, k, v projection, per-head RMSNorm on q and k, interleaved
        partial MRoPE (fp32), GroupQueryAttention, output * sigmoid(gate), o_proj."""
        s, out_scale = self.shape, self.options.synthesis.out_scale
        base = f"/model/layers.{layer}/attn"
        hd, heads, kv_heads = s.head_dim, s.num_attention_heads, s.num_key_value_heads
        q_norm = self.norm_weight(f"model.layers.{layer}.attn.q_norm.layernorm.weight", hd)
        k_norm = self.norm_weight(f"model.layers.{layer}.attn.k_norm.layernorm.weight", hd)
        self.rotary_caches()

        qkv_n = 2 * s.q_size + 2 * s.kv_size
        qkv = self.projection(f"{base}/qkv_proj/MatMul", root, qkv_n, s.hidden_size)
        split = [f"{base}/qkv_proj/Split/output_{i}" for i in range(3)]
        sizes = const("INT64", [2 * s.q_size, s.kv_size, s.kv_size])
        self.w.node("Split", [qkv, sizes], split, f"{base}/qkv_proj/Split", axis=-1)
        for name, width in zip(split, (2 * s.q_size, s.kv_size, s.kv_size)):
            self.value(name, self.hidden_shape(width))

        q_gate = self.reshape(f"{base}/q_gate/Reshape", split[0], [0, 0, heads, 2 * hd], [*BATCH_SEQ, heads, 2 * hd])
        q4d, gate4d = f"{base}/q_gate/Split/output_0", f"{base}/q_gate/Split/output_1"
        self.w.node("Split", [q_gate, const("INT64", [hd, hd])], [q4d, gate4d], f"{base}/q_gate/Split", axis=-1)
        self.value(q4d, [*BATCH_SEQ, heads, hd])
        self.value(gate4d, [*BATCH_SEQ, heads, hd])
        q = self.reshape(f"{base}/q_proj/Reshape", q4d, [0, 0, s.q_size], self.hidden_shape(s.q_size))
        gate = self.reshape(f"{base}/gate/Reshape", gate4d, [0, 0, s.q_size], self.hidden_shape(s.q_size))

        q = self._head_norm(f"{base}/q_norm", q, q_norm, "num_attention_heads", s.q_size)
        k = self._head_norm(f"{base}/k_norm", split[1], k_norm, "num_key_value_heads", s.kv_size)
        q = self._mrope(f"{base}/q_rotary", q, heads, s.q_size)
        k = self._mrope(f"{base}/k_rotary", k, kv_heads, s.kv_size)

        attn = f"{base}/GroupQueryAttention/output_0"
        self.w.node(
            "GroupQueryAttention",
            [q, k, split[2], f"past_key_values.{layer}.key", f"past_key_values.{layer}.value", seqlens, total,
             "", "", "", "", ""],
            [attn, f"present.{layer}.key", f"present.{layer}.value"],
            f"{base}/GroupQueryAttention", MS,
            num_heads=heads, kv_num_heads=kv_heads, scale=float(np.float32(1.0 / math.sqrt(hd))),
            local_window_size=-1, softcap=0.0, do_rotary=0, rotary_interleaved=0,
        )
        self.value(attn, self.hidden_shape(s.q_size))
        self.w.node("Sigmoid", [gate], [f"{base}/gate/Sigmoid/output_0"], f"{base}/gate/Sigmoid")
        self.value(f"{base}/gate/Sigmoid/output_0", self.hidden_shape(s.q_size))
        self.w.node("Mul", [attn, f"{base}/gate/Sigmoid/output_0"], [f"{base}/gate/Mul/output_0"], f"{base}/gate/Mul")
        self.value(f"{base}/gate/Mul/output_0", self.hidden_shape(s.q_size))
        return self.projection(f"{base}/o_proj/MatMul", f"{base}/gate/Mul/output_0", s.hidden_size, s.q_size, out_scale)

    def _head_norm(self, base: str, root: str, weight: str, heads_dim: str, width: int) -> str:
        hd = self.shape.head_dim
        rows = ["batch_size", f"sequence_length * {heads_dim}", hd]  # one row per head
        flat = self.reshape(f"{base}/Reshape_1", root, [0, -1, hd], rows)
        norm = f"{base}/SimplifiedLayerNormalization"
        normed = self.value(self.simple_norm(norm, flat, weight, f"{norm}/output_0"), rows)
        return self.reshape(f"{base}/Reshape_2", normed, [0, -1, width], self.hidden_shape(width))

    def _mrope(self, base: str, root: str, heads: int, width: int) -> str:
        """MRotaryEmbedding computed in fp32: fp16 graphs cast in and out, as the builder does."""
        s = self.shape
        name = f"{base}/MRotaryEmbedding"
        output = f"{name}/output_0"
        attrs = dict(
            interleaved=0, rotary_embedding_dim=s.rotary_dim, num_heads=heads,
            mrope_section=list(s.mrope_section), mrope_layout=1, is_packed_batching=0,
        )
        rope_inputs = ["position_ids", "cos_cache", "sin_cache"]
        if self.io == "FLOAT":
            self.w.node("MRotaryEmbedding", [root, *rope_inputs], [output], name, MS, **attrs)
            return self.value(output, self.hidden_shape(width))
        cast_in, rope_out = f"{name}/root_input/Cast/output_0", f"{name}/output_0/Cast/output_0"
        self.w.node("Cast", [root], [cast_in], f"{name}/root_input/Cast", to=1)
        self.value(cast_in, self.hidden_shape(width), "FLOAT")
        self.w.node("MRotaryEmbedding", [cast_in, *rope_inputs], [rope_out], name, MS, **attrs)
        self.value(rope_out, self.hidden_shape(width), "FLOAT")
        self.w.node("Cast", [rope_out], [output], f"{name}/output_0/Cast", to=10)
        return self.value(output, self.hidden_shape(width))

    def linear_attention(self, layer: int, root: str) -> str:
        """Gated DeltaNet: qkv/z/b/a projections, causal depthwise conv with state, per-head L2 norm
        of q and k, LinearAttentionGate, LinearAttention (gated delta rule), GatedRMSNorm, out_proj."""
        s, syn = self.shape, self.options.synthesis
        base = f"/model/layers.{layer}/linear_attn"
        prefix = f"model.layers.{layer}.linear_attn"
        conv_dim, kd, vd, hv = s.linear_conv_dim, s.linear_key_dim, s.linear_value_dim, s.linear_num_value_heads
        window = self.options.state_window

        qkv = self.projection(f"{base}/qkv_proj/MatMul", root, conv_dim, s.hidden_size)
        z = self.projection(f"{base}/z_proj/MatMul", root, vd, s.hidden_size)
        # b and a drive the recurrence; the builder keeps them dense ([H, Hv] MatMul) at any precision.
        gates = {}
        for tag in ("b", "a"):
            dense = Normal((s.hidden_size, hv), std=1.0 / math.sqrt(s.hidden_size))
            weight = self.float_init(f"{prefix}.{tag}_proj.MatMul.weight", dense)
            out = f"{base}/{tag}_proj/MatMul/output_0"
            self.w.node("MatMul", [root, weight], [out], f"{base}/{tag}_proj/MatMul")
            gates[tag] = self.value(out, self.hidden_shape(hv))

        qkv_t = f"{base}/qkv_proj/Transpose/output_0"
        self.w.node("Transpose", [qkv], [qkv_t], f"{base}/qkv_proj/Transpose", perm=[0, 2, 1])
        self.value(qkv_t, ["batch_size", conv_dim, "sequence_length"])
        kernel = s.linear_conv_kernel_dim
        conv_w = self.float_init(f"{prefix}.conv1d.weight", Normal((conv_dim, 1, kernel), std=1.0 / math.sqrt(kernel)))
        conv_b = self.array_init(f"{prefix}.conv1d.bias", np.zeros(conv_dim, np.float32))  # the builder writes zeros
        conv_out = f"{base}/CausalConvWithState/output_0"
        self.w.node(
            "CausalConvWithState", [qkv_t, conv_w, conv_b, f"past.{layer}.conv"], [conv_out, f"present.{layer}.conv"],
            f"{base}/CausalConvWithState", MS, ndim=1, activation="silu", state_window=window,
        )
        self.value(conv_out, ["batch_size", conv_dim, "sequence_length"])
        conv_t = f"{base}/conv_out/Transpose/output_0"
        self.w.node("Transpose", [conv_out], [conv_t], f"{base}/conv_out/Transpose", perm=[0, 2, 1])
        self.value(conv_t, self.hidden_shape(conv_dim))

        split = [f"{base}/split_qkv/Split/output_{i}" for i in range(3)]
        self.w.node("Split", [conv_t, const("INT64", [kd, kd, vd])], split, f"{base}/split_qkv/Split", axis=-1)
        for name, width in zip(split, (kd, kd, vd)):
            self.value(name, self.hidden_shape(width))
        q = self._l2_normalize(f"{base}/q_l2norm", split[0])
        k = self._l2_normalize(f"{base}/k_l2norm", split[1])
        scale = const(self.io, float(1.0 / np.sqrt(s.linear_key_head_dim)))
        q_scaled = f"{base}/q_scaled/Mul/output_0"
        self.w.node("Mul", [q, scale], [q_scaled], f"{base}/q_scaled/Mul")
        self.value(q_scaled, self.hidden_shape(kd))

        # g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b); A ~ U(1, 16) as Qwen initializes it.
        dt_bias = self.array_init(f"{prefix}.dt_bias", np.ones(hv, np.float32), "FLOAT")
        neg_exp_a = self.float_init(f"{prefix}.neg_exp_A", Uniform((hv,), -16.0, -1.0), "FLOAT")
        gate0, gate1 = f"{base}/LinearAttentionGate/output_0", f"{base}/LinearAttentionGate/output_1"
        self.w.node(
            "LinearAttentionGate", [gates["a"], dt_bias, neg_exp_a, gates["b"]], [gate0, gate1],
            f"{base}/LinearAttentionGate", MS,
        )
        self.value(gate0, self.hidden_shape(hv))
        self.value(gate1, self.hidden_shape(hv))

        la_out = f"{base}/LinearAttention/output_0"
        self.w.node(
            "LinearAttention",
            [q_scaled, k, split[2], f"past.{layer}.recurrent", gate0, gate1],
            [la_out, f"present.{layer}.recurrent"],
            f"{base}/LinearAttention", MS,
            q_num_heads=s.linear_num_key_heads, kv_num_heads=hv, update_rule="gated_delta", scale=1.0,
            state_window=window,
        )
        self.value(la_out, self.hidden_shape(vd))
        norm_w = self.norm_weight(f"{prefix}.norm.weight", s.linear_value_head_dim)
        normed = f"{base}/GatedRMSNorm/output_0"
        self.w.node("GatedRMSNorm", [la_out, norm_w, z], [normed], f"{base}/GatedRMSNorm", MS, epsilon=self.eps)
        self.value(normed, self.hidden_shape(vd))
        return self.projection(f"{base}/out_proj/MatMul", normed, s.hidden_size, vd, syn.out_scale)

    def _l2_normalize(self, base: str, root: str) -> str:
        s = self.shape
        heads, dk = s.linear_num_key_heads, s.linear_key_head_dim
        flat = self.reshape(f"{base}/flat/Reshape", root, [0, 0, heads, dk], [*BATCH_SEQ, heads, dk])
        normed = f"{base}/LpNormalization/output_0"
        self.w.node("LpNormalization", [flat], [normed], f"{base}/LpNormalization", axis=-1, p=2)
        self.value(normed, [*BATCH_SEQ, heads, dk])
        return self.reshape(f"{base}/unflat/Reshape", normed, [0, 0, heads * dk], self.hidden_shape(heads * dk))

    def lm_head(self, root: str, special_ids: tuple[int, ...]) -> None:
        s = self.shape
        # zero rows for the special tokens: their logit is exactly 0, far below the top random logit
        spec = self.int4_spec(s.vocab_size, s.hidden_size, zero_rows=tuple(special_ids))
        self.matmul("/lm_head/MatMul", root, spec, output="logits")

    # ---------------------------------------------------------------- graph I/O
    def kv_io(self, layers: list[int]) -> None:
        shape = ["batch_size", self.shape.num_key_value_heads, "past_sequence_length", "kv_cache_dim"]
        for kind in ("key", "value"):  # all keys, then all values: the builder's input order
            for layer in layers:
                self.w.add_input(f"past_key_values.{layer}.{kind}", self.io, shape)

    def kv_outputs(self, layers: list[int]) -> None:
        shape = ["batch_size", self.shape.num_key_value_heads, "total_sequence_length", "kv_cache_dim"]
        for kind in ("key", "value"):
            for layer in layers:
                self.w.add_output(f"present.{layer}.{kind}", self.io, shape)

    def state_shapes(self) -> tuple[list, list]:
        s = self.shape
        window = [self.options.state_window] if self.options.state_window else []
        conv = [*window, "batch_size", s.linear_conv_dim, s.linear_conv_kernel_dim - 1]
        recurrent = [*window, "batch_size", s.linear_num_value_heads, s.linear_key_head_dim, s.linear_value_head_dim]
        return conv, recurrent


def build_decoder(em: Emitter, special_ids: tuple[int, ...]) -> None:
    """model.onnx: the target model, with the final normed hidden state as an output for the head."""
    s, w = em.shape, em.w
    conv_shape, recurrent_shape = em.state_shapes()
    w.add_input("input_ids", "INT64", BATCH_SEQ)
    w.add_input("attention_mask", "INT64", ["batch_size", "total_sequence_length"])
    w.add_input("position_ids", "INT64", [3, *BATCH_SEQ])
    em.kv_io(s.attention_layers)
    for layer in s.linear_layers:
        w.add_input(f"past.{layer}.conv", em.io, conv_shape)
    for layer in s.linear_layers:
        w.add_input(f"past.{layer}.recurrent", em.io, recurrent_shape)
    w.add_output("hidden_states", em.io, em.hidden_shape())
    w.add_output("logits", em.io, [*BATCH_SEQ, s.vocab_size])
    em.kv_outputs(s.attention_layers)
    for layer in s.linear_layers:
        w.add_output(f"present.{layer}.conv", em.io, conv_shape)
    for layer in s.linear_layers:
        w.add_output(f"present.{layer}.recurrent", em.io, recurrent_shape)

    seqlens, total = em.attention_mask_reformat()
    embedded = em.embedding("/model/embed_tokens")
    residual, skip = embedded, None
    for layer, kind in enumerate(s.layer_types):
        normed, residual = em.input_layernorm(layer, embedded if skip is None else residual, residual, skip)
        if kind == "linear_attention":
            mixed = em.linear_attention(layer, normed)
        else:
            mixed = em.full_attention(layer, normed, seqlens, total)
        normed, residual = em.post_attention_layernorm(layer, residual, mixed)
        skip = em.mlp(layer, normed)

    final = s.num_hidden_layers
    weight = em.norm_weight(f"model.layers.{final}.final_norm_layernorm.weight", s.hidden_size, jitter=False)
    em.skip_norm(f"/model/layers.{final}/final_norm_layernorm/SkipLayerNorm", residual, skip, weight, ["hidden_states"])
    em.lm_head("hidden_states", special_ids)


def build_mtp(em: Emitter, special_ids: tuple[int, ...]) -> None:
    """mtp.onnx: fc(concat(norm(embed(token)), norm(hidden))) -> one gated full-attention layer ->
    norm -> lm_head; also returns the head's normed hidden state (hidden_states_out)."""
    s, w = em.shape, em.w
    w.add_input("input_ids", "INT64", BATCH_SEQ)
    w.add_input("attention_mask", "INT64", ["batch_size", "total_sequence_length"])
    w.add_input("position_ids", "INT64", [3, *BATCH_SEQ])
    em.kv_io([0])
    w.add_input("hidden_states", em.io, em.hidden_shape())
    w.add_output("logits", em.io, [*BATCH_SEQ, s.vocab_size])
    em.kv_outputs([0])
    w.add_output("hidden_states_out", em.io, em.hidden_shape())

    seqlens, total = em.attention_mask_reformat()
    embedded = em.embedding("/model/mtp/embed_tokens")
    # The two pre-fc norms have weight exactly 1: the identity path must carry the embedding as is.
    norm_e = em.norm_weight("model.mtp.pre_fc_norm_embedding.weight", s.hidden_size, jitter=False)
    norm_h = em.norm_weight("model.mtp.pre_fc_norm_hidden.weight", s.hidden_size, jitter=False)
    e, h = "/model/mtp/pre_fc_norm_embedding/output_0", "/model/mtp/pre_fc_norm_hidden/output_0"
    em.value(em.simple_norm("/model/mtp/pre_fc_norm_embedding", embedded, norm_e, e), em.hidden_shape())
    em.value(em.simple_norm("/model/mtp/pre_fc_norm_hidden", "hidden_states", norm_h, h), em.hidden_shape())
    w.node("Concat", [e, h], ["/model/mtp/fc/Concat/output_0"], "/model/mtp/fc/Concat", axis=-1)
    em.value("/model/mtp/fc/Concat/output_0", em.hidden_shape(2 * s.hidden_size))
    fc_spec = Int4Matrix(
        n=s.hidden_size, k=2 * s.hidden_size, block=s.block_size, identity_half=True,
        std=em.options.synthesis.mtp_noise / math.sqrt(s.hidden_size),
    )
    fc = em.value(em.matmul("/model/mtp/fc/MatMul", "/model/mtp/fc/Concat/output_0", fc_spec), em.hidden_shape())

    normed, residual = em.input_layernorm(0, fc, None, None)
    mixed = em.full_attention(0, normed, seqlens, total)
    normed, residual = em.post_attention_layernorm(0, residual, mixed)
    skip = em.mlp(0, normed)
    final = "/model/layers.1/final_norm_layernorm/output_0"
    weight = em.norm_weight("model.layers.1.final_norm_layernorm.weight", s.hidden_size, jitter=False)
    em.skip_norm("/model/layers.1/final_norm_layernorm/SkipLayerNorm", residual, skip, weight, [final])
    em.value(final, em.hidden_shape())
    em.lm_head(final, special_ids)
    w.node("Identity", [final], ["hidden_states_out"], "/model/mtp/hidden_states_out/Identity")
