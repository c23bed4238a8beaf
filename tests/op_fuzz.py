"""Random cases for the library's ops (CopySlots, MatMulNBits and its two-weight forms, GatedDeltaNet,
GroupQueryAttention, GatedAttention, SkipSimplifiedLayerNormalization), as a hostile model
file or a careless caller would build them: random shapes, element types, declared output types,
attributes, bound buffers, and weights as initializers or as graph inputs.

Each case is a valid base (random) with zero to two mutations, every mutation one that the op's
contract forbids. The outcome must be exactly one of:
  - no mutation: the run succeeds and equals the reference (CopySlots bitwise; MatMulNBits within the
    float64 reference's rounding bound);
  - a mutation: ONNX Runtime raises its own error (at session creation or at run time);
and never a crash. Run as a script it runs the cases in this process and prints one JSON line per
case before running it, so when the process dies the last line names the case:

    python tests/op_fuzz.py --provider cpu --cases 300 --seed 0
    compute-sanitizer --tool memcheck python tests/op_fuzz.py --provider cuda

tests/test_ops_fuzz.py runs it in a subprocess (a crash fails that test instead of the suite).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's packages, run as a script

import ops  # noqa: E402
from ops import gated_delta_net as gdn  # noqa: E402
from ops import gated_attention as gated  # noqa: E402
from ops import group_query_attention as gqa  # noqa: E402
from ops import nbits, norm, packing  # noqa: E402
from ops.copy_slots import Pair, copy_slots_model, elem_type, expected  # noqa: E402

NODE = "fuzz"
PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider"]}
COPY_DTYPES = ["float32", "float16", "bfloat16", "float64", "int64", "int32", "int8", "uint8", "bool"]
U32, UBF16 = 2.0**-24, 2.0**-8


class CaseFailure(AssertionError):
    pass


# ---------------------------------------------------------------------------------------------------
# Values: host arrays for every type (bfloat16 as its uint16 bit patterns), in and out of OrtValues

def random_array(rng, dtype: str, shape) -> np.ndarray:
    shape = tuple(int(d) for d in shape)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype == "bfloat16":
        return (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -100), min(info.max, 100), size=shape, dtype=dtype)
    return rng.standard_normal(shape).astype(dtype)


def ort_value(array: np.ndarray, dtype: str) -> ort.OrtValue:
    if dtype == "bfloat16":
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.asarray(array, order="C"), TensorProto.BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(np.asarray(array, order="C"))


def host_array(value: ort.OrtValue) -> np.ndarray:
    """A host OrtValue's contents (bfloat16 as uint16, which numpy lacks)."""
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    shape = value.shape()
    count = int(np.prod(shape)) if shape else 1
    raw = (ctypes.c_uint16 * count).from_address(value.data_ptr()) if count else []
    return np.array(raw, dtype=np.uint16).reshape(shape)


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values exactly representable in bfloat16 -> their bit patterns."""
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


# ---------------------------------------------------------------------------------------------------
# CopySlots

COPY_MUTATIONS = ["dst_dtype", "out_dtype", "trailing", "slot_range", "negative_slot", "slots_shape",
                  "drop_output", "drop_input", "bound_wrong"]


def copy_slots_case(rng) -> dict:
    whole = bool(rng.random() < 0.3)
    in_place = bool(rng.random() < 0.3)  # out_i bound to dst_i's own buffer, as the driver binds it
    dtypes = COPY_DTYPES if not in_place else [d for d in COPY_DTYPES if d != "bfloat16"]
    pairs = []
    for _ in range(int(rng.integers(1, 5))):
        rank = int(rng.integers(0 if whole else 1, 5))
        trailing = [int(d) for d in rng.integers(0, 5, size=max(rank - 1, 0))]
        src_lead, dst_lead = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        if whole:
            shape = ([src_lead] + trailing)[:rank]
            pairs.append(Pair(str(rng.choice(dtypes)), shape, list(shape)))
        else:
            pairs.append(Pair(str(rng.choice(dtypes)), [src_lead] + trailing, [dst_lead] + trailing))
    if whole:
        slots = [-1, -1]
    else:
        slots = [int(rng.integers(0, min(p.src_shape[0] for p in pairs))),
                 int(rng.integers(0, min(p.dst_shape[0] for p in pairs)))]
    count = int(rng.choice([0, 0, 1, 1, 2]))
    mutations = sorted({str(m) for m in rng.choice(COPY_MUTATIONS, size=count)})
    return {"op": "CopySlots", "pairs": [dataclasses.asdict(p) for p in pairs], "slots": slots, "whole": whole,
            "in_place": in_place, "mutations": mutations, "choice": int(rng.integers(0, 1 << 30))}


def _other(rng, options, not_this):
    return str(rng.choice([o for o in options if o != not_this]))


def apply_copy_mutations(case: dict, rng) -> tuple[list[Pair], list[int], dict]:
    pairs = [Pair(**p) for p in case["pairs"]]
    slots = list(case["slots"])
    build = {"n_inputs": None, "n_outputs": None, "slots_shape": (2,)}
    victim = pairs[case["choice"] % len(pairs)]
    # in place, dst is bound through OrtValue.ortvalue_from_numpy, which takes no bfloat16 (as in copy_slots_case)
    dtypes = COPY_DTYPES if not case["in_place"] else [d for d in COPY_DTYPES if d != "bfloat16"]
    for m in case["mutations"]:
        if m == "dst_dtype":
            victim.dst_dtype = _other(rng, dtypes, victim.dtype)
        elif m == "out_dtype":
            victim.out_dtype = _other(rng, dtypes, victim.dst_dtype or victim.dtype)
        elif m == "trailing":
            if len(victim.dst_shape) >= (1 if case["whole"] else 2):
                victim.dst_shape = list(victim.dst_shape[:-1]) + [victim.dst_shape[-1] + 1]
            else:  # rank too small to change a trailing dim: add one
                victim.dst_shape = list(victim.dst_shape) + [2]
            victim.out_shape = "dst"
        elif m == "slot_range":
            if case["whole"]:
                slots = [int(rng.integers(0, 3)), -1]
            else:
                side = case["choice"] % 2
                lead = (victim.src_shape if side == 0 else victim.dst_shape)[0]
                slots[side] = int(rng.choice([lead, lead + 7, 1 << 40, (1 << 62) + 3]))
        elif m == "negative_slot":
            slots = [int(v) for v in rng.choice([[-1, 0], [0, -1], [-2, -2], [-1, -2], [-(1 << 62), 0]])]
        elif m == "slots_shape":
            build["slots_shape"] = (int(rng.choice([1, 3, 4])),)
        elif m == "drop_output":
            build["n_outputs"] = len(pairs) - 1
        elif m == "drop_input":
            build["n_inputs"] = 2 * len(pairs)  # slots + all tensor inputs but the last
        elif m == "bound_wrong":
            pass  # applied at binding time
    return pairs, slots, build


def run_copy_slots(case: dict, provider: str) -> str:
    rng = np.random.default_rng(case["choice"])
    pairs, slots, build = apply_copy_mutations(case, rng)
    model = copy_slots_model(pairs, node_name=NODE, **build)
    data = []
    for p in pairs:
        src = random_array(rng, p.dtype, p.src_shape)
        dst = random_array(rng, p.dst_dtype or p.dtype, p.dst_shape)
        data.append((src, dst))
    slots_array = np.array(slots + [0] * (build["slots_shape"][0] - 2), np.int64)[: build["slots_shape"][0]]

    def go():
        session = make_session(model, provider)
        binding = session.io_binding()
        binding.bind_ortvalue_input("slots", ort.OrtValue.ortvalue_from_numpy(slots_array))
        bound = []
        n_in = build["n_inputs"] if build["n_inputs"] is not None else 2 * len(pairs) + 1
        n_out = build["n_outputs"] if build["n_outputs"] is not None else len(pairs)
        device = "cuda" if provider == "cuda" else "cpu"
        for i, (p, (src, dst)) in enumerate(zip(pairs, data)):
            if 1 + 2 * i < n_in:
                binding.bind_ortvalue_input(f"src_{i}", ort_value(src, p.dtype))
            if 2 + 2 * i >= n_in:
                continue
            if i >= n_out:
                binding.bind_ortvalue_input(f"dst_{i}", ort_value(dst, p.dst_dtype or p.dtype))
                continue
            if "bound_wrong" in case["mutations"] and p is pairs[case["choice"] % len(pairs)]:
                wrong = list(p.dst_shape) + [2] if case["choice"] % 2 else [max(int(np.prod(p.dst_shape)) - 1, 0) + 3]
                out = ort.OrtValue.ortvalue_from_shape_and_type(wrong, np.float64, device, 0)
                binding.bind_ortvalue_input(f"dst_{i}", ort_value(dst, p.dst_dtype or p.dtype))
                binding.bind_ortvalue_output(f"out_{i}", out)
                bound.append(None)
            elif case["in_place"]:
                value = ort.OrtValue.ortvalue_from_numpy(dst.copy(), device, 0)  # a copy: on the CPU it shares memory
                binding.bind_ortvalue_input(f"dst_{i}", value)
                binding.bind_ortvalue_output(f"out_{i}", value)
                bound.append(value)
            else:
                binding.bind_ortvalue_input(f"dst_{i}", ort_value(dst, p.dst_dtype or p.dtype))
                binding.bind_output(f"out_{i}", "cpu")
                bound.append(None)
        session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        return [v if v is not None else outputs[i] for i, v in enumerate(bound)]

    outcome, result = attempt(go)
    if case["mutations"]:
        return expect_error(outcome, result)
    if outcome != "ok":
        raise CaseFailure(f"a valid case failed: {result}")
    for i, (value, (src, dst)) in enumerate(zip(result, data)):
        got = value.numpy() if case["in_place"] else host_array(value)
        want = expected(src, dst, slots)
        if got.shape != want.shape or got.tobytes() != want.tobytes():
            raise CaseFailure(f"out_{i} differs from the reference (shape {got.shape} vs {want.shape})")
    return "ok"


# ---------------------------------------------------------------------------------------------------
# MatMulNBits

MATMUL_MUTATIONS = ["K_attr", "N_attr", "N_wrap", "bits_attr", "block_attr", "packing_attr", "accuracy_attr",
                    "float_attr", "B_shape", "B_dtype", "scales_shape", "scales_dtype", "zp_shape", "zp_dtype",
                    "bias_len", "A_last", "A_dtype", "Y_dtype", "g_idx"]


def matmul_case(rng) -> dict:
    tiles = bool(rng.random() < 0.2)
    if tiles:
        bits, block_size = 4, int(rng.choice([32, 64, 128]))
        K, N = 256 * int(rng.integers(1, 3)), 16 * int(rng.integers(1, 3))
        dtype, zero_points, bias = str(rng.choice(["float16", "bfloat16"])), None, bool(rng.random() < 0.5)
    else:
        bits, block_size = int(rng.choice([4, 8])), int(rng.choice([16, 32, 64, 128, 256]))
        K, N = int(rng.integers(1, 300)), int(rng.integers(1, 40))
        dtype = str(rng.choice(["float32", "float16", "bfloat16"]))
        zero_points = rng.choice([None, "packed", "typed"])
        bias = bool(rng.random() < 0.5)
    lead = [int(d) for d in rng.integers(0, 4, size=int(rng.integers(0, 3)))]  # A = [*lead, K]
    count = int(rng.choice([0, 0, 1, 1, 2]))
    mutations = sorted({str(m) for m in rng.choice(MATMUL_MUTATIONS, size=count)})
    return {"op": "MatMulNBits", "K": K, "N": N, "bits": bits, "block_size": block_size, "dtype": dtype,
            "zero_points": None if zero_points is None else str(zero_points), "bias": bias, "tiles": tiles,
            "lead": lead, "weights_as_inputs": bool(rng.random() < 0.3), "mutations": mutations,
            "choice": int(rng.integers(0, 1 << 30))}


def _set_attr(node, name, value):
    for attr in [a for a in node.attribute if a.name == name]:
        node.attribute.remove(attr)
    node.attribute.append(helper.make_attribute(name, value))


def _weight_arrays(w: nbits.NBitsWeights) -> dict:
    """The node's weight inputs as host arrays in their ONNX types (bfloat16 as bit patterns)."""
    def typed(values):
        if w.dtype == "bfloat16":
            return bf16_bits(values), "bfloat16"
        return np.asarray(values, dtype=w.dtype), w.dtype

    arrays = {"B": (w.b, "uint8"), "scales": typed(w.scales)}
    if w.zero_points is not None:
        arrays["zero_points"] = typed(w.zero_points) if w.typed_zero_points else (w.zero_points, "uint8")
    if w.bias is not None:
        arrays["bias"] = typed(w.bias)
    return arrays


def build_matmul(case: dict, rng):
    """(model, weights for the reference, activations A as float32 values of A's type, graph inputs)."""
    w = nbits.random_weights(rng, case["K"], case["N"], bits=case["bits"], block_size=case["block_size"],
                             dtype=case["dtype"], zero_points=case["zero_points"], bias=case["bias"])
    stored = w
    if case["tiles"]:
        stored = dataclasses.replace(w, b=packing.pack_b(w.b, w.N, w.K),
                                     scales=packing.pack_scales(w.scales, w.N, w.K, w.block_size))
    mutations = set(case["mutations"])
    if "N_wrap" in mutations:  # 1-D B and scales, whose size N' * row bytes wraps to the real one mod 2^64
        stored = dataclasses.replace(stored, b=stored.b.reshape(-1), scales=stored.scales.reshape(-1))
    model = nbits.single_node_model(stored, domain="ort_mtp", node_name=NODE, a_shape=(*case["lead"], None),
                                    float32_io=case["dtype"] == "bfloat16",
                                    packing=1 if case["tiles"] else None)
    node = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    graph_inputs = {}
    arrays = _weight_arrays(stored)
    for m in sorted(mutations):
        if m == "K_attr":
            # not K + 1 with A_last (A's last dim K + 1): the two together are a valid node wherever K + 1
            # needs no more quantisation blocks than K
            wrong = [case["K"] + 1, case["K"] - 1, 0, -5, 1 << 31, 1 << 40][1 if "A_last" in mutations else 0:]
            _set_attr(node, "K", int(rng.choice(wrong)))
        elif m == "N_attr":
            _set_attr(node, "N", int(rng.choice([case["N"] + 1, 0, -1, 1 << 31, 1 << 40])))
        elif m == "N_wrap":  # N' * row_bytes == N * row_bytes (mod 2^64): only a bound on N stops it
            row_bytes = w.k_blocks * w.block_size * w.bits // 8
            delta = (1 << 64) // (row_bytes & -row_bytes)
            _set_attr(node, "N", case["N"] + (delta if case["N"] + delta < (1 << 63) else 1 << 62))
        elif m == "bits_attr":
            _set_attr(node, "bits", int(rng.choice([0, 1, 2, 3, 5, 16, -4])))
        elif m == "block_attr":
            _set_attr(node, "block_size", int(rng.choice([0, 8, 48, 512, -32])))
        elif m == "packing_attr":
            _set_attr(node, "packing", int(rng.choice([2, -1, 7])))
        elif m == "accuracy_attr":
            _set_attr(node, "accuracy_level", int(rng.choice([-1, 5, 99])))
        elif m == "float_attr":
            _set_attr(node, str(rng.choice(["bits", "K", "N", "block_size"])), 4.0)
        elif m == "B_shape":
            b = arrays["B"][0]
            arrays["B"] = (b.reshape(-1)[:-1] if case["choice"] % 2 else np.concatenate([b, b[:1]]), "uint8")
        elif m == "B_dtype":
            arrays["B"] = (arrays["B"][0].astype(np.int8), "int8")
        elif m == "scales_shape":
            s, t = arrays["scales"]
            arrays["scales"] = (s.reshape(-1)[1:], t)
        elif m == "scales_dtype":
            s, t = arrays["scales"]
            other = "float16" if t == "float32" else "float32"
            arrays["scales"] = (s.astype(other), other)
        elif m == "zp_shape":
            z = arrays.get("zero_points", (np.zeros((w.N, 1), np.uint8), "uint8"))
            arrays["zero_points"] = (np.concatenate([z[0].reshape(-1), z[0].reshape(-1)[:1]]), z[1])
        elif m == "zp_dtype":
            arrays["zero_points"] = (rng.integers(0, 8, size=(w.N, w.k_blocks)).astype(np.int32), "int32")
        elif m == "bias_len":
            arrays["bias"] = (random_array(rng, w.dtype, [w.N + 1]), w.dtype)
        elif m == "A_dtype":  # the node's A becomes float64 (through the Cast where A is bfloat16)
            cast = next((n for n in model.graph.node if n.op_type == "Cast"), None)
            if cast is not None:
                _set_attr(cast, "to", TensorProto.DOUBLE)
            else:
                model.graph.input[0].type.tensor_type.elem_type = TensorProto.DOUBLE
        elif m == "Y_dtype":
            model.graph.output[0].type.tensor_type.elem_type = TensorProto.UINT8
        elif m == "g_idx":
            arrays["g_idx"] = (np.zeros(case["K"], np.int32), "int32")
    k_a = case["K"] + 1 if "A_last" in mutations else case["K"]
    if "A_last" in mutations:
        dims = model.graph.input[0].type.tensor_type.shape.dim
        dims[len(dims) - 1].dim_value = k_a
    _place_weights(model, node, arrays, graph_inputs, as_inputs=case["weights_as_inputs"])
    a = nbits.round_to(rng.standard_normal((*case["lead"], k_a)), case["dtype"]).astype(np.float32)
    a_dtype = "float32" if case["dtype"] == "bfloat16" else case["dtype"]
    if "A_dtype" in mutations and case["dtype"] != "bfloat16":
        a_dtype = "float64"
    graph_inputs["A"] = (a.astype(a_dtype), a_dtype)
    return model, w, a, graph_inputs


def _place_weights(model, node, arrays, graph_inputs, as_inputs: bool):
    """Puts the weight arrays into the node as initializers, or as graph inputs of unknown shape (so
    only the op's run-time checks see them)."""
    order = ["A", "B", "scales", "zero_points", "g_idx", "bias"]
    del model.graph.initializer[:]
    inputs = [node.input[0]]
    for name in order[1:]:
        if name not in arrays:
            inputs.append("")
            continue
        values, dtype = arrays[name]
        inputs.append(name)
        if as_inputs:
            model.graph.input.append(helper.make_tensor_value_info(name, elem_type(dtype), None))
            graph_inputs[name] = (values, dtype)
        else:
            model.graph.initializer.append(
                helper.make_tensor(name, elem_type(dtype), values.shape, np.ascontiguousarray(values).tobytes(),
                                   raw=True))
    while inputs[-1] == "":
        inputs.pop()
    del node.input[:]
    node.input.extend(inputs)


def run_matmul(case: dict, provider: str) -> str:
    rng = np.random.default_rng(case["choice"])
    model, w, a, graph_inputs = build_matmul(case, rng)

    def go():
        session = make_session(model, provider)
        feeds = {name: ort_value(values, dtype) for name, (values, dtype) in graph_inputs.items()}
        return session.run_with_ort_values(None, feeds)[0]

    outcome, result = attempt(go)
    if case["mutations"]:
        return expect_error(outcome, result)
    if outcome != "ok":
        raise CaseFailure(f"a valid case failed: {result}")
    y = host_array(result).astype(np.float64)
    ref, mag = nbits.reference(a, w), nbits.magnitude(a, w)
    if y.shape != ref.shape:
        raise CaseFailure(f"Y has shape {y.shape}, expected {ref.shape}")
    final = {"float32": 0.0, "float16": 2.0**-11, "bfloat16": UBF16}[w.dtype]
    # The device check's bound (fp32 partial sums in any order on the GPU): K/16 + 64 float32 roundings
    # of the magnitude, plus the final rounding to A's type; a wrong weight is off by ~|scale| |a|.
    tol = final * np.abs(ref) + U32 * (w.K / 16 + 64) * mag + U32
    if not np.all(np.abs(y - ref) <= tol):
        raise CaseFailure(f"Y differs from the reference: max error / bound {np.max(np.abs(y - ref) / tol):.3g}")
    return "ok"


# ---------------------------------------------------------------------------------------------------
# MatMulNBits with a second weight set (N2: two outputs, or activation="swiglu": one), on either EP
# (CUDA computes in float32 whatever accuracy_level says, as for one weight set).

PAIR_MUTATIONS = ["N2_attr", "B2_shape", "scales2_dtype", "zp2_presence", "activation_attr", "swiglu_N2",
                  "second_without_N2", "packing_attr", "outputs"]


def matmul_pair_case(rng) -> dict:
    swiglu = bool(rng.random() < 0.5)
    K, N = int(rng.integers(1, 300)), int(rng.integers(1, 40))
    return {"op": "MatMulNBitsPair", "K": K, "N": N, "N2": N if swiglu else int(rng.integers(1, 40)),
            "block_size": int(rng.choice([16, 32, 64, 128])), "dtype": str(rng.choice(["float32", "float16"])),
            "zero_points": rng.choice([None, "packed", "typed"]), "bias": bool(rng.random() < 0.5),
            "accuracy_level": int(rng.choice([0, 4])), "swiglu": swiglu,
            "lead": [int(d) for d in rng.integers(0, 4, size=int(rng.integers(0, 3)))],
            "mutations": sorted({str(m) for m in rng.choice(PAIR_MUTATIONS, size=int(rng.choice([0, 0, 1, 1, 2])))}),
            "choice": int(rng.integers(0, 1 << 30))}


def run_matmul_pair(case: dict, provider: str) -> str:
    rng = np.random.default_rng(case["choice"])
    zp = None if case["zero_points"] is None else str(case["zero_points"])
    weights = [nbits.random_weights(rng, case["K"], n, block_size=case["block_size"], dtype=case["dtype"],
                                    zero_points=zp, bias=case["bias"]) for n in (case["N"], case["N2"])]
    mutations = set(case["mutations"])
    second = weights[1]
    if "zp2_presence" in mutations:  # the second set with zero points exactly when the first has none
        second = nbits.random_weights(rng, case["K"], case["N2"], block_size=case["block_size"], dtype=case["dtype"],
                                      zero_points=None if zp else "packed", bias=case["bias"])
    if "B2_shape" in mutations:
        second = dataclasses.replace(second, b=second.b[:, :, :-1] if second.b.shape[2] > 1 else second.b[:-1])
    activation = "swiglu" if case["swiglu"] else None
    if "swiglu_N2" in mutations:  # swiglu over two sets of different widths
        second = nbits.random_weights(rng, case["K"], case["N"] + 1, block_size=case["block_size"],
                                      dtype=case["dtype"], zero_points=zp, bias=case["bias"])
        activation = "swiglu"
    model = nbits.single_node_model(weights[0], domain="ort_mtp", node_name=NODE, a_shape=(*case["lead"], None),
                                    accuracy_level=case["accuracy_level"], second=second, activation=activation)
    node = model.graph.node[0]
    if "scales2_dtype" in mutations:  # scales2 in float64, not A's type
        init = next(t for t in model.graph.initializer if t.name == "scales2")
        init.CopyFrom(nbits.tensor("scales2", second.scales.astype(np.float64)))
    for m in sorted(mutations):
        if m == "N2_attr":
            _set_attr(node, "N2", int(rng.choice([case["N2"] + 1, -1, 1 << 40])))
        elif m == "activation_attr":
            _set_attr(node, "activation", str(rng.choice(["gelu", "SWIGLU", ""])) if rng.random() < 0.7 else 1)
            if attribute_value(node, "activation") == "":
                _set_attr(node, "activation", "relu")
        elif m == "second_without_N2":
            for attr in [a for a in node.attribute if a.name in ("N2", "activation")]:
                node.attribute.remove(attr)
            if len(node.output) == 2:
                node.output.pop()
                model.graph.output.pop()
        elif m == "packing_attr":
            _set_attr(node, "packing", int(rng.choice([2, -1, 7])))
        elif m == "outputs":  # one output too many or too few for the form
            if len(node.output) == 2:
                node.output.pop()
                model.graph.output.pop()
            else:
                node.output.append("Y2")
                model.graph.output.append(helper.make_tensor_value_info("Y2", elem_type(case["dtype"]), None))
    a = nbits.round_to(rng.standard_normal((*case["lead"], case["K"])), case["dtype"]).astype(case["dtype"])

    def go():
        return make_session(model, provider).run(None, {"A": a})

    outcome, result = attempt(go)
    if case["mutations"]:
        return expect_error(outcome, result)
    if outcome != "ok":
        raise CaseFailure(f"a valid case failed: {result}")
    final = {"float32": 0.0, "float16": 2.0**-11}[case["dtype"]]
    refs = []
    for w in weights:
        if case["accuracy_level"] == 4 and a.size and provider == "cpu":
            ref, mag = nbits.int8_reference(a.astype(np.float32), w)
            ref, mag = ref.reshape(*case["lead"], w.N), mag.reshape(*case["lead"], w.N)
        else:
            ref, mag = nbits.reference(a, w), nbits.magnitude(a, w)
        refs.append((ref, final * np.abs(ref) + U32 * (w.K / 16 + 64) * mag + U32))
    outputs = [np.asarray(y, np.float64) for y in result]
    if case["swiglu"]:
        (g, tg), (u, tu) = refs
        sig = 1.0 / (1.0 + np.exp(-g))
        want = g * sig * u
        # |d silu(g) / dg| <= 1.1; the activation's own rounding: a few ulps of the output's type
        tol = 1.1 * tg * np.abs(u) + np.abs(g * sig) * tu + (4 * 2.0**-23 + final) * np.abs(want) + U32
        checks = [("Y", outputs[0], want, tol)]
    else:
        checks = [(name, y, ref, tol) for name, y, (ref, tol) in zip(("Y", "Y2"), outputs, refs)]
    for name, y, want, tol in checks:
        if y.shape != want.shape:
            raise CaseFailure(f"{name} has shape {y.shape}, expected {want.shape}")
        if not np.all(np.abs(y - want) <= tol):
            raise CaseFailure(f"{name} differs from the reference: max error / bound {np.max(np.abs(y - want) / tol):.3g}")
    return "ok"


def attribute_value(node, name):
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr).decode() if attr.type == attr.STRING else None
    return None


# ---------------------------------------------------------------------------------------------------
# GatedDeltaNet

GDN_MUTATIONS = ["heads_attr", "v_heads_attr", "head_dim_attr", "window_attr", "qkv_shape", "z_shape", "gate_shape",
                 "conv_weight_shape", "past_conv_shape", "past_recurrent_shape", "input_dtype", "output_dtype",
                 "drop_input", "drop_output"]


def gated_delta_net_case(rng) -> dict:
    hk = int(rng.integers(1, 3))
    return {"op": "GatedDeltaNet", "num_k_heads": hk, "num_v_heads": hk * int(rng.integers(1, 3)),
            "k_head_dim": int(rng.choice([4, 8, 16])), "v_head_dim": int(rng.choice([4, 8, 16])),
            "conv_kernel": int(rng.choice([2, 4])), "state_window": int(rng.choice([0, 0, 2, 4])),
            "dtype": str(rng.choice(["float32", "float16", "bfloat16"])), "batch": int(rng.integers(0, 3)),
            "seq": int(rng.integers(1, 7)), "weights_as_inputs": bool(rng.random() < 0.3),
            "conv_bias": bool(rng.random() < 0.7),
            "mutations": sorted({str(m) for m in rng.choice(GDN_MUTATIONS, size=int(rng.choice([0, 0, 1, 1, 2])))}),
            "choice": int(rng.integers(0, 1 << 30))}


def _bump(shape, axis):
    shape = list(shape)
    shape[axis] += 1
    return shape


def run_gated_delta_net(case: dict, provider: str) -> str:
    rng = np.random.default_rng(case["choice"])
    cfg = gdn.GdnConfig(case["num_k_heads"], case["num_v_heads"], case["k_head_dim"], case["v_head_dim"],
                        conv_kernel=case["conv_kernel"], state_window=case["state_window"], dtype=case["dtype"])
    weights = gdn.random_weights(rng, cfg, conv_bias=case["conv_bias"])
    inputs = gdn.random_inputs(rng, cfg, case["batch"], case["seq"])
    attrs, input_dtypes, output_dtypes, build = {}, {}, {}, {}
    bad = dict(inputs)  # what is fed: the valid inputs, or a mis-shaped one
    for m in case["mutations"]:
        if m == "heads_attr":
            attrs["num_k_heads"] = int(rng.choice([0, -1, case["num_k_heads"] + 1, 1 << 40]))
        elif m == "v_heads_attr":
            attrs["num_v_heads"] = int(rng.choice([0, case["num_v_heads"] + 1, 2 * case["num_v_heads"] + 1]))
        elif m == "head_dim_attr":
            attrs[str(rng.choice(["k_head_dim", "v_head_dim"]))] = int(rng.choice([0, 3, 1 << 20]))
        elif m == "window_attr":
            attrs["state_window"] = int(rng.choice([-1, 3, 65])) if case["state_window"] else 2
        elif m in ("qkv_shape", "z_shape", "gate_shape"):
            name = {"qkv_shape": "qkv", "z_shape": "z", "gate_shape": str(rng.choice(["a", "b"]))}[m]
            bad[name] = gdn.round_to(rng.standard_normal(_bump(inputs[name].shape, -1)), cfg.dtype)
        elif m == "past_conv_shape":
            # batch or channels: a longer last axis (K - 1) would agree with a conv_weight_shape mutation
            bad["past_conv"] = np.zeros(_bump(inputs["past_conv"].shape, int(rng.integers(-3, -1))), np.float32)
        elif m == "past_recurrent_shape":
            bad["past_recurrent"] = np.zeros(_bump(inputs["past_recurrent"].shape, int(rng.integers(-3, 0))),
                                             np.float32)
        elif m == "conv_weight_shape":  # K one more than the conv state holds
            weights.conv_weight = np.concatenate([weights.conv_weight, weights.conv_weight[..., :1]], axis=-1)
        elif m == "input_dtype":
            input_dtypes[str(rng.choice(["qkv", "z", "norm_weight"]))] = "float64"
        elif m == "output_dtype":
            output_dtypes[str(rng.choice(list(gdn.OUTPUTS)))] = str(rng.choice(["float64", "uint8"]))
        elif m == "drop_input":
            build["n_inputs"] = int(rng.integers(1, len(gdn.INPUTS)))
        elif m == "drop_output":
            build["n_outputs"] = int(rng.integers(0, len(gdn.OUTPUTS)))
    as_inputs = case["weights_as_inputs"] or "input_dtype" in case["mutations"]
    if as_inputs and weights.conv_bias is None:
        input_dtypes["conv_bias"] = None  # the node's conv_bias input left empty
    bf16 = cfg.dtype == "bfloat16"

    def go():
        model = gdn.gated_delta_net_model(cfg, None if as_inputs else weights, node_name=NODE, float32_io=bf16,
                                          attrs=attrs, input_dtypes=input_dtypes, output_dtypes=output_dtypes,
                                          **build)
        session = make_session(model, provider)
        names = {i.name for i in session.get_inputs()}
        values = gdn.feeds(bad, cfg, weights if as_inputs else None, float32_io=bf16)
        for name, dtype in input_dtypes.items():
            if dtype is not None and name in values:
                values[name] = values[name].astype(dtype)
        return session.run(None, {k: v for k, v in values.items() if k in names})

    outcome, result = attempt(go)
    if case["mutations"]:
        return expect_error(outcome, result)
    if outcome != "ok":
        raise CaseFailure(f"a valid case failed: {result}")
    want = gdn.reference(cfg, weights, inputs, magnitudes=True)
    u = {"float32": U32, "float16": 2.0**-11, "bfloat16": UBF16}[cfg.dtype]
    for name, got in zip(gdn.OUTPUTS, result):
        ref = want[name].astype(np.float64)
        got = np.asarray(got, np.float64)
        if got.shape != ref.shape:
            raise CaseFailure(f"{name} has shape {got.shape}, expected {ref.shape}")
        # The reference computes in double and rounds where the subgraph stores a tensor; the kernels
        # (the CPU's default and CUDA's) compute in float32, hence a margin of float32 roundings: of the
        # values themselves, and for y of y_magnitude, the size its float32 error can reach where the
        # state product o cancels (a few roundings of sum_i |S_ij q_i| through the gated norm; the
        # largest ratio of error to U32 x (y_magnitude + |y|) over 400 float32 cases was 7.1:
        # bench/results/2026-12-05-op-fuzz-seeds/gdn_bound.py).
        rms = float(np.sqrt(np.mean(ref * ref))) if ref.size else 0.0
        scale = np.abs(ref) + rms + (want["y_magnitude"] if name == "y" else 0.0)
        tol = 8 * u * (np.abs(ref) + rms) + 64 * U32 * scale + 1e-30
        if not np.all(np.abs(got - ref) <= tol):
            raise CaseFailure(f"{name} differs from the reference: max error / bound {np.max(np.abs(got - ref) / tol):.3g}")
    return "ok"


# ---------------------------------------------------------------------------------------------------
# GroupQueryAttention

GQA_MUTATIONS = ["heads_attr", "kv_heads_attr", "rotary_attr", "window_attr", "seqlens_low", "seqlens_high",
                 "total_bad", "key_shape", "past_shape", "seqlens_shape", "input_dtype", "output_dtype",
                 "drop_input", "drop_output"]


def group_query_attention_case(rng) -> dict:
    kv = int(rng.integers(1, 3))
    case = {"op": "GroupQueryAttention", "num_heads": kv * int(rng.integers(1, 4)), "kv_num_heads": kv,
            "head_size": int(rng.choice([8, 16, 32])), "dtype": str(rng.choice(["float32", "float16"])),
            "batch": int(rng.integers(0, 3)), "seq": int(rng.integers(1, 7)), "past": int(rng.integers(0, 6)),
            "spare": int(rng.integers(0, 4)), "window": int(rng.choice([-1, -1, 2, 5])),
            "softcap": float(rng.choice([0.0, 0.0, 4.0])), "shared": bool(rng.random() < 0.4),
            "mutations": sorted({str(m) for m in rng.choice(GQA_MUTATIONS, size=int(rng.choice([0, 0, 1, 1, 2])))}),
            "choice": int(rng.integers(0, 1 << 30))}
    if any(m.startswith("seqlens") for m in case["mutations"]):
        case["batch"] = max(case["batch"], 1)  # bad values need a batch row to hold them
    return case


def run_group_query_attention(case: dict, provider: str) -> str:
    rng = np.random.default_rng(case["choice"])
    cfg = gqa.GqaConfig(case["num_heads"], case["kv_num_heads"], case["head_size"], local_window_size=case["window"],
                        softcap=case["softcap"], dtype=case["dtype"])
    buffer = case["past"] + case["seq"] + case["spare"]
    feeds = gqa.random_case(rng, cfg, case["batch"], case["seq"], case["past"], buffer)
    attrs, input_dtypes, output_dtypes = cfg.attributes(), {}, {}
    inputs, outputs = list(gqa.INPUTS), list(gqa.OUTPUTS)
    for m in case["mutations"]:
        if m == "heads_attr":
            attrs["num_heads"] = int(rng.choice([0, -3, 1 << 40, case["num_heads"] + 1]))
        elif m == "kv_heads_attr":
            attrs["kv_num_heads"] = int(rng.choice([0, case["num_heads"] + 1]))
        elif m == "rotary_attr":
            attrs["do_rotary"] = 1
        elif m == "window_attr":
            attrs["local_window_size"] = int(rng.choice([0, -2]))
        elif m == "seqlens_low":  # a total below the call's tokens (a padded row), or negative
            feeds["seqlens_k"] = np.full(case["batch"], int(rng.choice([-1, -(1 << 31), case["seq"] - 2])), np.int32)
        elif m == "seqlens_high":  # tokens past the end of the cache
            feeds["seqlens_k"] = np.full(case["batch"], int(rng.choice([buffer, (1 << 31) - 1])), np.int32)
        elif m == "total_bad":
            feeds["total_sequence_length"] = np.array(rng.choice([0, -7]), np.int32) if rng.random() < 0.5 \
                else np.array([1, 2], np.int32)
        elif m == "key_shape":
            name = str(rng.choice(["key", "value", "query"]))
            shape = list(feeds[name].shape)
            shape[-1] += 1
            feeds[name] = np.zeros(shape, feeds[name].dtype)
        elif m == "past_shape":
            name, axis = str(rng.choice(["past_key", "past_value"])), int(rng.choice([1, 3]))
            shape = list(feeds[name].shape)
            shape[axis] += 1
            feeds[name] = np.zeros(shape, feeds[name].dtype)
        elif m == "seqlens_shape":
            feeds["seqlens_k"] = np.zeros(case["batch"] + 1, np.int32)
        elif m == "input_dtype":
            name = str(rng.choice(["query", "past_key", "seqlens_k"]))
            input_dtypes[name] = "float64" if name != "seqlens_k" else "int64"
            feeds[name] = feeds[name].astype(input_dtypes[name])
        elif m == "output_dtype":
            output_dtypes[str(rng.choice(gqa.OUTPUTS))] = str(rng.choice(["float64", "uint8"]))
        elif m == "drop_input":
            inputs = inputs[:int(rng.integers(1, len(inputs)))]
        elif m == "drop_output":
            outputs = outputs[:int(rng.integers(0, len(outputs)))]
    shared = case["shared"] and not case["mutations"]

    def go():
        model = gqa.model(cfg, node_name=NODE, attributes=attrs, symbolic=True, input_dtypes=input_dtypes,
                          output_dtypes=output_dtypes)
        node = model.graph.node[0]
        del node.input[len(inputs):]
        del node.output[len(outputs):]
        del model.graph.input[len(inputs):]
        del model.graph.output[len(outputs):]
        session = make_session(model, provider)
        values = {k: v for k, v in feeds.items() if k in inputs}
        if not shared:
            return session.run(None, values)
        # The driver's binding: present written into past's own buffers, which must be on the provider's
        # device (a host buffer bound to a CUDA session would be copied, and the copy would not be shared);
        # total_sequence_length stays on the host, where the op reads it.
        arrays = {k: v.copy() for k, v in values.items()}  # kept alive: host OrtValues use their memory
        bound = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) if provider == "cuda" and k != "total_sequence_length"
                 else ort.OrtValue.ortvalue_from_numpy(v) for k, v in arrays.items()}
        binding = session.io_binding()
        for name, value in bound.items():
            binding.bind_ortvalue_input(name, value)
        binding.bind_output("output", "cuda" if provider == "cuda" else "cpu")
        binding.bind_ortvalue_output("present_key", bound["past_key"])
        binding.bind_ortvalue_output("present_value", bound["past_value"])
        session.run_with_iobinding(binding)
        cache = [bound[k].numpy() if provider == "cuda" else arrays[k].copy() for k in ("past_key", "past_value")]
        return [binding.get_outputs()[0].numpy(), *cache]

    outcome, result = attempt(go)
    if case["mutations"]:
        return expect_error(outcome, result, case, provider)
    if outcome != "ok":
        raise CaseFailure(f"a valid case failed: {result}")
    want = gqa.reference(cfg, **feeds, share_buffer=shared)
    u = {"float32": U32, "float16": 2.0**-11}[cfg.dtype]
    for name, ref, got in zip(gqa.OUTPUTS, want, result):
        got = np.asarray(got, np.float64)
        if got.shape != ref.shape:
            raise CaseFailure(f"{name} has shape {got.shape}, expected {ref.shape}")
        scale = float(np.abs(ref).max()) if ref.size else 0.0
        tol = 0.0 if name != "output" else u * np.abs(ref) + 64 * U32 * scale + 1e-30  # the cache is a copy
        if not np.all(np.abs(got - ref) <= tol):
            raise CaseFailure(f"{name} differs from the reference: max error {np.max(np.abs(got - ref)):.3g}")
    return "ok"


# ---------------------------------------------------------------------------------------------------
# GatedAttention

GA_MUTATIONS = ["heads_attr", "section_attr", "rotary_attr", "interleaved_attr", "positions_bad", "qkv_shape",
                "cache_shape", "norm_shape", "seqlens_high", "input_dtype", "output_dtype", "drop_input",
                "drop_output"]


def gated_attention_case(rng) -> dict:
    kv = int(rng.integers(1, 3))
    head = int(rng.choice([8, 16, 32]))
    rot = int(rng.choice([0, head // 2, head]))
    half = (rot or head) // 2
    h = int(rng.integers(0, half + 1))
    w = int(rng.integers(0, half - h + 1))
    case = {"op": "GatedAttention", "num_heads": kv * int(rng.integers(1, 4)), "kv_num_heads": kv, "head_size": head,
            "rotary_dim": rot, "mrope_section": [half - h - w, h, w], "mrope_layout": int(rng.integers(0, 2)),
            "dtype": str(rng.choice(["float32", "float16"])), "batch": int(rng.integers(0, 3)),
            "seq": int(rng.integers(1, 6)), "past": int(rng.integers(0, 6)), "spare": int(rng.integers(0, 4)),
            "mutations": sorted({str(m) for m in rng.choice(GA_MUTATIONS, size=int(rng.choice([0, 0, 1, 1, 2])))}),
            "choice": int(rng.integers(0, 1 << 30))}
    if any(m in ("positions_bad", "seqlens_high") for m in case["mutations"]):
        case["batch"] = max(case["batch"], 1)  # bad values need a batch row to hold them
    return case


def run_gated_attention(case: dict, provider: str) -> str:
    rng = np.random.default_rng(case["choice"])
    cfg = gated.GatedAttentionConfig(case["num_heads"], case["kv_num_heads"], case["head_size"], case["rotary_dim"],
                                     tuple(case["mrope_section"]), case["mrope_layout"], dtype=case["dtype"])
    buffer = case["past"] + case["seq"] + case["spare"]
    feeds = gated.random_case(rng, cfg, case["batch"], case["seq"], case["past"], buffer,
                              max_position=case["past"] + case["seq"] + 8)
    attrs = cfg.attributes()
    inputs, outputs = list(gated.INPUTS), list(gated.OUTPUTS)
    retype: dict[str, str] = {}
    for m in case["mutations"]:
        if m == "heads_attr":
            attrs[str(rng.choice(["num_heads", "kv_num_heads"]))] = int(rng.choice([0, -1, 1 << 40]))
        elif m == "section_attr":
            attrs["mrope_section"] = [[1, 1], [100, 0, 0], [-1, 0, 0]][int(rng.integers(0, 3))]
        elif m == "rotary_attr":
            attrs["rotary_embedding_dim"] = int(rng.choice([3, -2, 4 * case["head_size"]]))
        elif m == "interleaved_attr":
            attrs["interleaved"] = 1
        elif m == "positions_bad":  # in a stream some rotary column reads (the CUDA kernel reads no other)
            feeds["position_ids"] = feeds["position_ids"].copy()
            stream = int(rng.choice(np.unique(gated.stream_of_column(cfg))))
            huge = int(np.iinfo(feeds["position_ids"].dtype).max)  # int64 or int32 positions
            feeds["position_ids"][stream, 0, 0] = int(rng.choice([-1, huge, len(feeds["cos_cache"])]))
        elif m == "qkv_shape":
            shape = list(feeds["qkv"].shape)
            shape[-1] += int(rng.choice([1, -1, 2 * case["head_size"]]))
            feeds["qkv"] = np.zeros(shape, feeds["qkv"].dtype)
        elif m == "cache_shape":
            name = str(rng.choice(["cos_cache", "sin_cache"]))
            feeds[name] = np.zeros((len(feeds[name]), feeds[name].shape[1] + 1), np.float32)
        elif m == "norm_shape":
            name = str(rng.choice(["q_norm_weight", "k_norm_weight"]))
            feeds[name] = np.ones(case["head_size"] + 1, feeds[name].dtype)
        elif m == "seqlens_high":
            feeds["seqlens_k"] = np.full(case["batch"], int(rng.choice([buffer, (1 << 31) - 1])), np.int32)
        elif m == "input_dtype":
            name = str(rng.choice(["qkv", "position_ids", "cos_cache", "past_key"]))
            retype[name] = {"position_ids": "int32", "cos_cache": "float64"}.get(name, "float64")
            feeds[name] = feeds[name].astype(retype[name])
        elif m == "output_dtype":
            retype[str(rng.choice(gated.OUTPUTS))] = str(rng.choice(["float64", "uint8"]))
        elif m == "drop_input":
            inputs = inputs[:int(rng.integers(1, len(inputs)))]
        elif m == "drop_output":
            outputs = outputs[:int(rng.integers(0, len(outputs)))]

    def go():
        from onnx import helper as h

        model = gated.model(cfg, node_name=NODE, attributes=attrs)
        for vi in list(model.graph.input) + list(model.graph.output):
            if vi.name in retype:
                vi.type.tensor_type.elem_type = h.np_dtype_to_tensor_dtype(np.dtype(retype[vi.name]))
        node = model.graph.node[0]
        del node.input[len(inputs):]
        del node.output[len(outputs):]
        del model.graph.input[len(inputs):]
        del model.graph.output[len(outputs):]
        return make_session(model, provider).run(None, {k: v for k, v in feeds.items() if k in inputs})

    outcome, result = attempt(go)
    if case["mutations"]:
        return expect_error(outcome, result, case, provider)
    if outcome != "ok":
        raise CaseFailure(f"a valid case failed: {result}")
    want = gated.reference(cfg, **feeds)
    atol = {"float32": 2e-5, "float16": 2e-2}[cfg.dtype]
    for name, ref, got in zip(gated.OUTPUTS, want, result):
        got = np.asarray(got, np.float64)
        if got.shape != ref.shape:
            raise CaseFailure(f"{name} has shape {got.shape}, expected {ref.shape}")
        if not np.all(np.abs(got - ref) <= atol * (1 + np.abs(ref))):
            raise CaseFailure(f"{name} differs from the reference: max error {np.max(np.abs(got - ref)):.3g}")
    return "ok"


# ---------------------------------------------------------------------------------------------------
# SkipSimplifiedLayerNormalization

NORM_MUTATIONS = ["epsilon_attr", "mean_output", "skip_shape", "gamma_shape", "bias_shape", "scalar_input",
                  "skip_dtype"]


def skip_norm_case(rng) -> dict:
    return {"op": "SkipSimplifiedLayerNormalization", "hidden": int(rng.integers(1, 300)),
            "lead": [int(d) for d in rng.integers(0, 5, size=int(rng.integers(0, 3)))],
            "dtype": str(rng.choice(["float32", "float16"])), "bias": bool(rng.random() < 0.5),
            "sum": bool(rng.random() < 0.7), "epsilon": float(rng.choice([1e-6, 1e-5, 0.0, 0.5])),
            "mutations": sorted({str(m) for m in rng.choice(NORM_MUTATIONS, size=int(rng.choice([0, 0, 1, 1, 2])))}),
            "choice": int(rng.integers(0, 1 << 30))}


def run_skip_norm(case: dict, provider: str) -> str:
    rng = np.random.default_rng(case["choice"])
    H, dtype, mutations = case["hidden"], case["dtype"], set(case["mutations"])
    gamma = nbits.round_to(1 + rng.standard_normal(H) / 4, dtype)
    bias = nbits.round_to(rng.standard_normal(H), dtype) if case["bias"] else None
    outputs = ["output", "mean" if "mean_output" in mutations else "", "", "input_skip_bias_sum" if case["sum"] else ""]
    while not outputs[-1]:
        outputs.pop()
    model = norm.model(H, dtype, node_name=NODE, epsilon=case["epsilon"], gamma=gamma, bias=bias, outputs=outputs)
    node = model.graph.node[0]
    if "epsilon_attr" in mutations:
        choice = int(rng.integers(0, 3))
        if choice == 0:
            node.ClearField("attribute")
        else:
            _set_attr(node, "epsilon", float("nan") if choice == 1 else -1.0)
    if "gamma_shape" in mutations or "bias_shape" in mutations:
        name = "gamma" if "gamma_shape" in mutations or bias is None else "bias"
        init = next(t for t in model.graph.initializer if t.name == name)
        init.CopyFrom(nbits.tensor(name, np.ones(H + 1, np.float32).astype(dtype)))
    shape = [*case["lead"], H]
    x = nbits.round_to(rng.standard_normal(shape), dtype).astype(dtype)
    r = nbits.round_to(rng.standard_normal(shape), dtype).astype(dtype)
    if "skip_shape" in mutations:
        r = np.concatenate([r, r[..., :1]], axis=-1)
    if "scalar_input" in mutations:
        x, r = np.asarray(gamma[0], dtype), np.asarray(gamma[0], dtype)
    if "skip_dtype" in mutations:  # skip declared and fed in the other float type
        other = "float16" if dtype == "float32" else "float32"
        model.graph.input[1].type.tensor_type.elem_type = elem_type(other)
        r = r.astype(other)
    for graph_input in model.graph.input:  # free shapes: the op, not ORT's shape inference, sees them
        graph_input.type.tensor_type.ClearField("shape")

    def go():
        return make_session(model, provider).run(None, {"input": x, "skip": r})

    outcome, result = attempt(go)
    if mutations:
        return expect_error(outcome, result)
    if outcome != "ok":
        raise CaseFailure(f"a valid case failed: {result}")
    want, s = norm.reference(x, r, gamma, case["epsilon"], bias)
    terms = np.abs(x.astype(np.float64)) + np.abs(r.astype(np.float64)) + (np.abs(bias) if bias is not None else 0)
    inv = 1.0 / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + case["epsilon"]) if s.size else s
    unit = {"float32": U32, "float16": 2.0**-11}[dtype]
    tol = (4 * unit + (H + 8) * U32) * terms * inv * np.abs(gamma) + U32
    y = np.asarray(result[0], np.float64)
    if y.shape != want.shape:
        raise CaseFailure(f"output has shape {y.shape}, expected {want.shape}")
    if not np.all(np.abs(y - want) <= tol):
        raise CaseFailure(f"output differs from the reference: max error / bound {np.max(np.abs(y - want) / tol):.3g}")
    return "ok"


# ---------------------------------------------------------------------------------------------------
# Running cases

def make_session(model, provider: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the errors are read from the exceptions
    ops.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=PROVIDERS[provider])


def attempt(fn):
    """('ok', result) or ('error', message) for an ONNX Runtime error; any other exception is a bug of
    this script and propagates."""
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001 - sorted below
        # run_with_iobinding reports a failed run as a RuntimeError("Error in execution: ...").
        if type(e).__module__.startswith("onnxruntime") or str(e).startswith("Error in execution"):
            return "error", f"{type(e).__name__}: {e}"
        raise


# Inputs the attention ops' CUDA kernels read on the device, where checking them on the host would cost a
# synchronisation per call (group_query_attention_cuda.cu): a bad value there gives NaN output rows, not
# an error. A case whose only mutations are these is a "nan" case on CUDA; any other mutation is caught
# on the host first, so such a case still gives an error.
DEVICE_CHECKED = {"GroupQueryAttention": {"seqlens_low", "seqlens_high"},
                  "GatedAttention": {"positions_bad", "seqlens_high"}}


def expect_error(outcome: str, result, case: dict | None = None, provider: str = "cpu") -> str:
    if case is not None and provider == "cuda" and set(case["mutations"]) <= DEVICE_CHECKED.get(case["op"], set()):
        if outcome != "ok":
            raise CaseFailure(f"a value the CUDA kernel checks on the device gave an error, not NaN rows: {result}")
        if not np.isnan(np.asarray(result[0], np.float64)).any():
            raise CaseFailure("a value the CUDA kernel checks on the device gave no NaN output row")
        return "nan"
    if outcome != "error":
        raise CaseFailure("a case the contract forbids ran without an error")
    if not str(result).strip():
        raise CaseFailure("the error has no message")
    return "error"


CASE_MAKERS = (copy_slots_case, matmul_case, gated_delta_net_case, group_query_attention_case,
               gated_attention_case, matmul_pair_case, skip_norm_case)  # case i: op i % 7
RUNNERS = {"CopySlots": run_copy_slots, "MatMulNBits": run_matmul, "GatedDeltaNet": run_gated_delta_net,
           "GroupQueryAttention": run_group_query_attention, "GatedAttention": run_gated_attention,
           "MatMulNBitsPair": run_matmul_pair, "SkipSimplifiedLayerNormalization": run_skip_norm}


def make_case(seed: int, index: int) -> dict:
    return CASE_MAKERS[index % len(CASE_MAKERS)](np.random.default_rng([seed, index]))


def run_case(case: dict, provider: str) -> str:
    return RUNNERS[case["op"]](case, provider)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", choices=sorted(PROVIDERS), default="cpu")
    parser.add_argument("--cases", type=int, default=300, help="cases to run (default 300)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case", type=int, help="run only this case index (to reproduce one)")
    args = parser.parse_args(argv)
    indices = [args.case] if args.case is not None else range(args.cases)
    failures = 0
    counts: dict[str, int] = {}
    for index in indices:
        case = make_case(args.seed, index)
        print(json.dumps({"case": index, **case}), flush=True)
        try:
            outcome = run_case(case, args.provider)
        except CaseFailure as e:
            failures += 1
            outcome = "FAILED"
            print(json.dumps({"case": index, "failure": str(e)}), flush=True)
        key = f"{case['op']} {outcome}"
        counts[key] = counts.get(key, 0) + 1
    print(json.dumps({"summary": counts, "failures": failures}), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
