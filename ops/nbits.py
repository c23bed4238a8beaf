"""MatMulNBits weights in numpy: blockwise quantisation, packing, a float64 reference and a one-node model.

The layout is com.microsoft::MatMulNBits' (and so ort_mtp::MatMulNBits'):
  B            uint8 [N, k_blocks, block_size * bits / 8]; element k of a block sits in bits
               [bits * (k % (8 / bits)), ...) of byte k * bits / 8, low bits first
  scales       A's type, [N, k_blocks]
  zero_points  optional: uint8 packed like B, one row of N padded to whole bytes
               [N, ceil(k_blocks * bits / 8)], or A's type [N, k_blocks] (a real-valued zero point);
               absent means 2^(bits-1)
  bias         optional, A's type [N]
  Y[m, n] = sum_k A[m, k] * (q[n, k] - zp[n, k // block_size]) * scale[n, k // block_size] + bias[n]

Used by the tests, the device correctness checks and anyone who needs int4/int8 weights that a
MatMulNBits node accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ELEM_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
"""The activation types MatMulNBits accepts, by name."""


@dataclass
class NBitsWeights:
    """One MatMulNBits weight set. Float arrays are float32 holding values exactly representable in
    `dtype` (so casting them to `dtype` is lossless)."""

    K: int
    N: int
    bits: int
    block_size: int
    dtype: str                      # "float32", "float16" or "bfloat16"
    b: np.ndarray                   # uint8 [N, k_blocks, block_bytes]
    scales: np.ndarray              # float32 [N, k_blocks]
    zero_points: np.ndarray | None  # uint8 [N, zp_row_bytes] (packed) or float32 [N, k_blocks] (typed)
    bias: np.ndarray | None         # float32 [N]

    @property
    def k_blocks(self) -> int:
        return -(-self.K // self.block_size)

    @property
    def typed_zero_points(self) -> bool:
        return self.zero_points is not None and self.zero_points.dtype != np.uint8


UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
"""Half the spacing of each float type at 1: one rounding to the type moves a value by at most this much
relative to it (the checks' tolerances are multiples of it)."""


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 copy of x rounded (to nearest even) to the values of `dtype`."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "float32":
        return x.copy()
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        bits = x.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return rounded.astype(np.uint32).view(np.float32)
    raise ValueError(f"unsupported dtype {dtype!r}: expected one of {sorted(ELEM_TYPES)}")


def pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """Packs integers in [0, 2^bits) along the last axis, low bits first; the last axis must hold a
    whole number of bytes' worth of values."""
    values = np.asarray(values, dtype=np.uint8)
    per_byte = 8 // bits
    if values.shape[-1] % per_byte:
        raise ValueError(f"last axis {values.shape[-1]} is not a multiple of {per_byte}")
    grouped = values.reshape(*values.shape[:-1], -1, per_byte).astype(np.uint16)
    shifts = (np.arange(per_byte, dtype=np.uint16) * bits)
    return (grouped << shifts).sum(axis=-1).astype(np.uint8)


def unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Inverse of pack_bits: the first `count` values of the last axis."""
    packed = np.asarray(packed, dtype=np.uint8)
    per_byte = 8 // bits
    shifts = (np.arange(per_byte, dtype=np.uint8) * bits)
    values = (packed[..., None] >> shifts) & ((1 << bits) - 1)
    return values.reshape(*packed.shape[:-1], -1)[..., :count]


def random_weights(rng: np.random.Generator, K: int, N: int, *, bits: int = 4, block_size: int = 32,
                   dtype: str = "float32", zero_points: str | None = None, bias: bool = False,
                   scale: float | None = None) -> NBitsWeights:
    """Random quantised weights. zero_points: None, "packed" (uint8) or "typed" (A's type).

    The bytes past K in the last block are random too: a correct kernel never reads them as weights.
    """
    k_blocks = -(-K // block_size)
    levels = 1 << bits
    q = rng.integers(0, levels, size=(N, k_blocks * block_size), dtype=np.uint8)
    b = pack_bits(q, bits).reshape(N, k_blocks, block_size * bits // 8)
    if scale is None:
        scale = 1.0 / (levels * np.sqrt(K))  # keeps |Y| ~ |A|: fp16 stays far from overflow
    scales = round_to(rng.uniform(-2.0, 2.0, size=(N, k_blocks)) * scale, dtype)
    zp = None
    if zero_points == "packed":
        row_values = -(-k_blocks * bits // 8) * (8 // bits)
        zp = pack_bits(rng.integers(0, levels, size=(N, row_values), dtype=np.uint8), bits)
    elif zero_points == "typed":
        zp = round_to(rng.uniform(0, levels - 1, size=(N, k_blocks)), dtype)
    elif zero_points is not None:
        raise ValueError(f"zero_points must be None, 'packed' or 'typed', got {zero_points!r}")
    bias_values = round_to(rng.standard_normal(N), dtype) if bias else None
    return NBitsWeights(K, N, bits, block_size, dtype, b, scales, zp, bias_values)


def quant_values(w: NBitsWeights) -> np.ndarray:
    """q[n, k] for k < K, as float64."""
    q = unpack_bits(w.b.reshape(w.N, -1), w.bits, w.k_blocks * w.block_size)
    return q[:, : w.K].astype(np.float64)


def zero_point_values(w: NBitsWeights) -> np.ndarray:
    """zero point per (n, block) [N, k_blocks], as float64."""
    if w.zero_points is None:
        return np.full((w.N, w.k_blocks), float(1 << (w.bits - 1)))
    if w.typed_zero_points:
        return w.zero_points.astype(np.float64)
    return unpack_bits(w.zero_points, w.bits, w.k_blocks).astype(np.float64)


def per_k(block_values: np.ndarray, w: NBitsWeights) -> np.ndarray:
    """Expands [N, k_blocks] to [N, K] (each block's value repeated over its elements)."""
    return np.repeat(block_values, w.block_size, axis=1)[:, : w.K]


def dequantize(w: NBitsWeights) -> np.ndarray:
    """Exact dequantised weight matrix [N, K] in float64."""
    return (quant_values(w) - per_k(zero_point_values(w), w)) * per_k(w.scales.astype(np.float64), w)


def reference(a: np.ndarray, w: NBitsWeights) -> np.ndarray:
    """Y = A x dequant(B)^T + bias in float64 (A's leading dims kept)."""
    a64 = np.asarray(a, dtype=np.float64)
    y = a64 @ dequantize(w).T
    if w.bias is not None:
        y = y + w.bias.astype(np.float64)
    return y


def magnitude(a: np.ndarray, w: NBitsWeights) -> np.ndarray:
    """sum_k |A[m,k]| |scale| (|q| + |zp|) + |bias|: a bound on every partial sum and product a kernel
    forms on the way to Y[m, n], whichever way it groups (q - zp) * scale. Rounding errors are
    proportional to it."""
    s = per_k(np.abs(w.scales.astype(np.float64)), w)
    t = s * (np.abs(quant_values(w)) + np.abs(per_k(zero_point_values(w), w)))
    mag = np.abs(np.asarray(a, dtype=np.float64)) @ t.T
    if w.bias is not None:
        mag = mag + np.abs(w.bias.astype(np.float64))
    return mag


def tensor(name: str, values: np.ndarray, dtype: str | None = None) -> onnx.TensorProto:
    """TensorProto of float32 `values` stored as `dtype` (float32/float16/bfloat16), or of values'
    own dtype when dtype is None."""
    if dtype is None or dtype == "float32":
        return numpy_helper.from_array(np.asarray(values, dtype=values.dtype if dtype is None else np.float32), name)
    if dtype == "float16":
        return numpy_helper.from_array(np.asarray(values, dtype=np.float16), name)
    if dtype == "bfloat16":
        raw = (np.asarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return helper.make_tensor(name, TensorProto.BFLOAT16, raw.shape, raw.tobytes(), raw=True)
    raise ValueError(f"unsupported dtype {dtype!r}")


def single_node_model(w: NBitsWeights, *, domain: str = "com.microsoft", a_shape=("M", None),
                      accuracy_level: int | None = None, node_name: str = "matmul",
                      flat_scales: bool = False, float32_io: bool = False,
                      packing: int | None = None, second: NBitsWeights | None = None,
                      activation: str | None = None) -> onnx.ModelProto:
    """A model with one MatMulNBits node of `domain`: input A [*a_shape] (None = K), output Y.
    Weights are initializers, as they are in `w` (packing only sets the attribute: ops.packing
    regroups the weights). float32_io: A and Y are float32, cast to and from w.dtype around the
    node (how bfloat16 is fed from numpy, which has no bfloat16). ir_version 10 because ONNX Runtime
    1.31 refuses newer IR versions.

    second: ort_mtp's second weight set on the same A (inputs B2, scales2, zero_points2, bias2 and
    attribute N2): a second output Y2, or with activation="swiglu" one output Y = silu(A x w) *
    (A x second) (swiglu_reference)."""
    elem = ELEM_TYPES[w.dtype]
    io_elem = TensorProto.FLOAT if float32_io else elem
    a_dims = [w.K if d is None else d for d in a_shape]
    inits = []

    def weight_inputs(ws: NBitsWeights, sfx: str) -> list[str]:
        scales = ws.scales.reshape(-1) if flat_scales else ws.scales
        inits.extend([tensor("B" + sfx, ws.b), tensor("scales" + sfx, scales, ws.dtype)])
        names = ["B" + sfx, "scales" + sfx]
        if ws.zero_points is not None:
            inits.append(tensor("zero_points" + sfx, ws.zero_points, ws.dtype if ws.typed_zero_points else None))
            names.append("zero_points" + sfx)
        else:
            names.append("")
        if sfx == "":
            names.append("")  # g_idx
        if ws.bias is not None:
            inits.append(tensor("bias" + sfx, ws.bias, ws.dtype))
            names.append("bias" + sfx)
        else:
            names.append("")
        return names

    a_name = "A_cast" if float32_io else "A"
    inputs = [a_name] + weight_inputs(w, "")
    outputs = ["Y"]
    if second is not None:
        inputs += weight_inputs(second, "2")
        if activation is None:
            outputs.append("Y2")
    while inputs and inputs[-1] == "":
        inputs.pop()
    attrs = dict(K=w.K, N=w.N, bits=w.bits, block_size=w.block_size)
    if accuracy_level is not None:
        attrs["accuracy_level"] = accuracy_level
    if packing is not None:
        attrs["packing"] = packing
    if second is not None:
        attrs["N2"] = second.N
    if activation is not None:
        attrs["activation"] = activation
    node_outputs = [f"{y}_cast" for y in outputs] if float32_io else outputs
    nodes = [helper.make_node("MatMulNBits", inputs, node_outputs, name=node_name, domain=domain, **attrs)]
    if float32_io:
        nodes.insert(0, helper.make_node("Cast", ["A"], [a_name], to=elem))
        nodes += [helper.make_node("Cast", [f"{y}_cast"], [y], to=TensorProto.FLOAT) for y in outputs]
    n_out = {"Y": w.N, "Y2": second.N if second is not None else 0}
    graph = helper.make_graph(
        nodes, "matmul_nbits",
        [helper.make_tensor_value_info("A", io_elem, a_dims)],
        [helper.make_tensor_value_info(y, io_elem, list(a_dims[:-1]) + [n_out[y]]) for y in outputs],
        initializer=inits,
    )
    return helper.make_model(graph, ir_version=10,
                             opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(domain, 1)])


def swiglu_reference(gate: np.ndarray, up: np.ndarray, dtype: str) -> np.ndarray:
    """ort_mtp::MatMulNBits' activation="swiglu" from its two products as two nodes write them (values
    of `dtype`): silu(g) * u = g / (1 + exp(-g)) * u in float32, rounded to `dtype`. numpy's float32
    exp may differ from the C library's by an ulp, so compare within a few ulps of the result."""
    g = np.asarray(gate, np.float32)
    u = np.asarray(up, np.float32)
    with np.errstate(over="ignore"):
        return round_to(g / (np.float32(1) + np.exp(-g)) * u, dtype)


def int8_quantize(a: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The int8 quantisation of A that MatMulNBits' accuracy_level 4 path (ours) applies, exactly:
    per row and block of `block_size` k (A zero-padded to whole blocks), s = float32(max |a| / 127)
    (a float32 division), qa = clamp(round-half-even(float32(a / s)), -127, 127), and qa = 0 where
    s == 0. Returns (qa as float64 [M, kp], s as float64 [M, k_blocks]). A is float32 (values of the
    activation type) with leading dims flattened."""
    a32 = np.asarray(a, dtype=np.float32)
    a32 = a32.reshape(-1, a32.shape[-1])
    M, K = a32.shape
    k_blocks = -(-K // block_size)
    padded = np.zeros((M, k_blocks * block_size), np.float32)
    padded[:, :K] = a32
    blocks = padded.reshape(M, k_blocks, block_size)
    s = (np.abs(blocks).max(axis=2) / np.float32(127)).astype(np.float32)
    safe = np.where(s == 0, np.float32(1), s)[:, :, None]
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.clip(np.rint((blocks / safe).astype(np.float32)), -127, 127)
    q = np.where(s[:, :, None] == 0, 0, q)
    return q.reshape(M, -1).astype(np.float64), s.astype(np.float64)


def int8_reference(a: np.ndarray, w: NBitsWeights) -> tuple[np.ndarray, np.ndarray]:
    """Y of the accuracy_level 4 path in float64 from the exact int8 quantisation of A (int8_quantize):
    Y[m, n] = sum_b scale[n, b] s[m, b] sum_{k in b} qa[m, k] (q[n, k] - zp[n, b]) + bias[n], and its
    magnitude sum_b |scale s| sum_k |qa| (|q| + |zp|) + |bias| (the bound on every term and partial
    sum the kernel forms in float32). Both [M, N], A's leading dims flattened."""
    qa, s = int8_quantize(a, w.block_size)
    kp = qa.shape[1]
    q = unpack_bits(w.b.reshape(w.N, -1), w.bits, kp).astype(np.float64)
    zp = zero_point_values(w)
    M, kb = s.shape
    qa3 = qa.reshape(M, kb, w.block_size)
    q3 = q.reshape(w.N, kb, w.block_size)
    # the integer dot per (m, n, block): exact in float64 (|.| < 2^53)
    dot = np.einsum("mbk,nbk->mnb", qa3, q3)
    qsum = qa3.sum(axis=2)                                 # [M, kb]
    d = dot - zp[None, :, :] * qsum[:, None, :]            # [M, N, kb]
    sc = s[:, None, :] * w.scales.astype(np.float64)[None, :, :]
    y = (d * sc).sum(axis=2)
    mag = (np.abs(sc) * (np.einsum("mbk,nbk->mnb", np.abs(qa3), np.abs(q3))
                         + np.abs(zp)[None, :, :] * np.abs(qa3).sum(axis=2)[:, None, :])).sum(axis=2)
    if w.bias is not None:
        y = y + w.bias.astype(np.float64)
        mag = mag + np.abs(w.bias.astype(np.float64))
    return y, mag
