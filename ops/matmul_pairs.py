"""Pairs of ort_mtp::MatMulNBits nodes that read one input -> one node with two weight sets (inputs B2,
scales2, zero_points2, bias2 and attribute N2: csrc/matmul_nbits/matmul_nbits.cc), where the library
runs that form (the CPU EP).

A Gated DeltaNet layer's qkv and z projections both read the layer's normed hidden state. As one node
they cost ONNX Runtime one dispatch instead of two and the CPU int8 kernel one quantisation of the
input instead of two; each output is bit for bit what its own node computed (the kernel walks the first
weight set's columns, then the second's, as two nodes do). A node qualifies when it has no g_idx, the
row-major layout (packing 0) and no second weight set yet; two qualify as a pair when they read the
same A, agree in K, bits, block_size, accuracy_level and in having zero points or not, and their
weights are initializers (so nothing they read is computed between them). Nodes are paired in graph
order (a third reader of the same A stays alone); the new node is named "<first>+<second>" and sits
where the first was, and the outputs keep their names. The gated MLP's projections are fused with
their activation by ops.mlp first, so they are no longer candidates here.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from . import DOMAIN, MATMUL_NBITS, nbits, probe
from .patterns import attribute, graphs_and_functions

_SHARED = ("K", "bits", "block_size", "accuracy_level")
_KNOWN = set(_SHARED) | {"N", "packing"}
_TYPES = {ir.DataType.FLOAT: "float32", ir.DataType.FLOAT16: "float16", ir.DataType.BFLOAT16: "bfloat16"}


def _inputs(node: ir.Node) -> list:
    return list(node.inputs) + [None] * (6 - len(node.inputs))


def _candidate(node: ir.Node) -> bool:
    if node.domain != DOMAIN or node.op_type != MATMUL_NBITS or len(node.outputs) != 1:
        return False
    if any(name not in _KNOWN for name in node.attributes) or attribute(node, "packing", 0) != 0:
        return False
    a, b, scales, zp, g_idx, bias = _inputs(node)
    if a is None or g_idx is not None:
        return False
    return all(v is None or v.is_initializer() for v in (b, scales, zp, bias)) and b is not None and scales is not None


def _key(node: ir.Node) -> tuple:
    return tuple(attribute(node, name) for name in _SHARED) + (_inputs(node)[3] is None,)


def merge(model: ir.Model, available=None) -> list[str]:
    """In place, in every graph and function: each pair of qualifying nodes (module docstring) becomes
    one two-weight node. `available(dtype) -> None | reason`, if given, is asked with A's element type
    and a pair is left alone when it answers with a reason. Returns the new nodes' names."""
    merged = []
    for container in list(graphs_and_functions(model)):
        readers: dict[ir.Value, list[ir.Node]] = {}
        for node in container:
            if _candidate(node):
                readers.setdefault(node.inputs[0], []).append(node)
        for a, nodes in readers.items():
            if len(nodes) < 2 or (available is not None and available(a.dtype)):
                continue
            by_key: dict[tuple, list[ir.Node]] = {}
            for node in nodes:
                by_key.setdefault(_key(node), []).append(node)
            for same in by_key.values():
                for first, second in zip(same[0::2], same[1::2]):
                    _, b, scales, zp, _, bias = _inputs(first)
                    _, b2, scales2, zp2, _, bias2 = _inputs(second)
                    inputs = [a, b, scales, zp, None, bias, b2, scales2, zp2, bias2]
                    while inputs[-1] is None:
                        inputs.pop()
                    attributes = [ir.AttrInt64(name, attribute(first, name)) for name in _SHARED + ("N",)
                                  if name in first.attributes]
                    attributes.append(ir.AttrInt64("N2", attribute(second, "N")))
                    new = ir.Node(DOMAIN, MATMUL_NBITS, inputs, attributes=attributes, num_outputs=2,
                                  name=f"{first.name}+{second.name}", doc_string=first.doc_string)
                    new.metadata_props.update(first.metadata_props)
                    old_values = [first.outputs[0], second.outputs[0]]
                    for value, old in zip(new.outputs, old_values):  # keep what the graph knew of the outputs
                        value.type, value.shape = old.type, old.shape
                    ir.convenience.replace_nodes_and_values(container, first, [first, second], [new], old_values,
                                                            list(new.outputs))
                    merged.append(new.name)
    return merged


def _probe_model(name: str):
    rng = np.random.default_rng(0)
    w1, w2 = nbits.random_weights(rng, 32, 8, dtype=name), nbits.random_weights(rng, 32, 16, dtype=name)
    return nbits.single_node_model(w1, domain=DOMAIN, node_name="probe", second=w2, accuracy_level=4)


def available(library: str, provider: str = "cpu", dtype: ir.DataType = ir.DataType.FLOAT,
              device_id: int = 0) -> str | None:
    """None when `library` runs ort_mtp::MatMulNBits' two-weight form on `provider` for `dtype`, else why
    not (one line; a one-node session, cached per library file)."""
    return probe.by_type(f"{MATMUL_NBITS} (N2)", library, provider, dtype, _TYPES, _probe_model, device_id)
