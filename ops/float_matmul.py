"""ONNX MatMul with a constant [K, N] weight -> ort_mtp::MatMul, whose output rows do not depend on the
number of rows (csrc/float_matmul/float_matmul.h has the kernels' orders).

The builder keeps the Gated DeltaNet's a and b projections dense at every precision (a [hidden,
value heads] MatMul each, models/graph.py and onnxruntime-genai's builders/qwen.py). On the CUDA EP
ORT runs them on cuBLAS, which picks a GEMM algorithm (and a split of K over blocks) by the number of
rows, so a width-k+1 verify's a and b rows are not guaranteed to be those of k+1 width-1 steps; our op
computes every row in one fixed order. A node is rewritten when:

- it is an ONNX MatMul (domain "") whose B is an initializer or Constant of rank 2, [K, N] with
  N <= MAX_N: the op is a GEMV made for narrow outputs (one block per 8 columns on CUDA), so wide
  dense projections (in a float16 folder without int4 weights) stay on ORT's GEMMs, which are far
  faster at a prefill's thousands of rows;
- A and B are float32, float16 or bfloat16, of one type;
- the library runs ort_mtp::MatMul on the model's execution provider for that type (`available`).
Everything else is kept as it was and reported with the reason. The node keeps its name, inputs and
output; the weight is not read or copied.

Then `merge_shared_inputs` makes each pair of ort_mtp::MatMul nodes that read the same A one node
with two weights, MatMul(A, B, B2) -> (Y, Y2), whose outputs are bit for bit those of the two nodes
(csrc/float_matmul/float_matmul.h). The a and b projections of a Gated DeltaNet layer read the same
normed hidden, and each is mostly launch and memory latency (a few microseconds at N = 48 on an H200),
so one launch for both halves that cost. The outputs keep their names.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import RewriteRule

from . import DOMAIN, probe
from .kinds import FLOAT_MATMUL
from .patterns import PatternMismatch, Rewrite, check

OP = "MatMul"
MAX_N = 1024
_TYPES = {ir.DataType.FLOAT: "float32", ir.DataType.FLOAT16: "float16", ir.DataType.BFLOAT16: "bfloat16"}


def reference(a, b) -> np.ndarray:
    """float64 reference: a [..., K] @ b [K, N]."""
    return np.asarray(a, np.float64) @ np.asarray(b, np.float64)


def model(k: int, n: int, dtype: str = "float32", domain: str = DOMAIN,
          node_name: str = "/model/layers.0/linear_attn/a_proj/MatMul", weight: np.ndarray | None = None,
          a_dtype: str | None = None, y_dtype: str | None = None, b_shape: list | None = None,
          float32_io: bool = False, n2: int | None = None, weight2: np.ndarray | None = None,
          b2_shape: list | None = None):
    """A one-node model: A [batch, seq, K] (symbolic batch and seq) times B [K, N] -> Y [batch, seq, N].
    With `weight` B is an initializer holding it (bfloat16: values exactly representable), else a graph
    input. a_dtype / y_dtype override the declared element types of A and Y, b_shape B's declared
    shape (graph input only). float32_io: A and Y are float32 graph values cast to and from `dtype`
    around the node (numpy and ORT's Python API have no bfloat16 arrays). n2 (or weight2): the
    two-weight node, a second weight B2 [K, n2] (an initializer holding weight2, else a graph input of
    shape b2_shape or [K, n2]) and a second output Y2 [batch, seq, n2]."""
    from onnx import TensorProto, helper, numpy_helper

    def elem(name):
        return TensorProto.BFLOAT16 if name == "bfloat16" else helper.np_dtype_to_tensor_dtype(np.dtype(name))

    t = elem(dtype)
    io = TensorProto.FLOAT if float32_io else None
    inputs = [helper.make_tensor_value_info("A", io or elem(a_dtype or dtype), ["batch", "seq", k])]
    outputs = [helper.make_tensor_value_info("Y", io or elem(y_dtype or dtype), ["batch", "seq", n])]
    initializers, nodes = [], []

    def add_weight(name, value, shape):
        if value is None:
            inputs.append(helper.make_tensor_value_info(name, t, shape))
        elif dtype == "bfloat16":
            bits = (np.asarray(value, np.float32).view(np.uint32) >> 16).astype(np.uint16)
            initializers.append(helper.make_tensor(name, TensorProto.BFLOAT16, bits.shape, bits.tobytes(), raw=True))
        else:
            initializers.append(numpy_helper.from_array(np.asarray(value, dtype), name))

    add_weight("B", weight, b_shape or [k, n])
    two = n2 is not None or weight2 is not None
    if two:
        n2 = weight2.shape[1] if weight2 is not None else n2
        add_weight("B2", weight2, b2_shape or [k, n2])
        outputs.append(helper.make_tensor_value_info("Y2", io or elem(y_dtype or dtype), ["batch", "seq", n2]))
    a, ys = ("A_cast", ["Y_cast", "Y2_cast"]) if float32_io else ("A", ["Y", "Y2"])
    ys = ys[:2 if two else 1]
    if float32_io:
        nodes.append(helper.make_node("Cast", ["A"], [a], to=t))
    nodes.append(helper.make_node(OP, [a, "B"] + (["B2"] if two else []), ys, name=node_name, domain=domain))
    if float32_io:
        nodes += [helper.make_node("Cast", [y], [y[:-len("_cast")]], to=TensorProto.FLOAT) for y in ys]
    graph = helper.make_graph(nodes, "matmul", inputs, outputs, initializer=initializers)
    opsets = [helper.make_opsetid("", 21)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, ir_version=10, opset_imports=opsets)


def unsupported_reason(node: ir.Node) -> str | None:
    """Why ort_mtp::MatMul should not run this MatMul node (as the graph shows it), or None."""
    a, b = (list(node.inputs) + [None, None])[:2]
    if a is None or b is None:
        return "it does not have two inputs"
    weight = b.const_value
    if weight is None:
        producer = b.producer()
        if producer is not None and producer.op_type == "Constant" and producer.domain == "":
            weight = ir.convenience.get_const_tensor(b)
    if weight is None:
        return f"B ({b.name}) is not a constant weight"
    shape = list(weight.shape)
    if len(shape) != 2:
        return f"B ({b.name}) has rank {len(shape)}, not a [K, N] matrix"
    if shape[1] > MAX_N:
        return f"B ({b.name}) has N = {shape[1]} columns, more than the {MAX_N} this op is made for"
    if weight.dtype not in _TYPES:
        return f"B ({b.name}) is {weight.dtype}, not float32, float16 or bfloat16"
    if a.dtype is not None and a.dtype != weight.dtype:
        return f"A ({a.name}) is {a.dtype} but B is {weight.dtype}"
    return None


class FloatMatMulRewrite(Rewrite):
    """Every ONNX MatMul our op runs (see the module docstring) becomes an ort_mtp MatMul.
    available(dtype) -> None | reason, if given, is asked with the weight's element type."""

    name = FLOAT_MATMUL

    def rules(self) -> list[RewriteRule]:
        return [RewriteRule(self._pattern, self._replacement, self._check, name="MatMulToOrtMtp")]

    def is_candidate(self, node: ir.Node) -> bool:
        return node.op_type == OP and node.domain in ("", "ai.onnx")

    @staticmethod
    def _pattern(op, a, b):
        return op.MatMul(a, b, _outputs=["y"])

    @check
    def _check(self, context, a, b, y, **_) -> bool:
        node = y.producer()
        self.require_selected(node)
        problem = unsupported_reason(node)
        if problem:
            raise PatternMismatch(None, problem)
        self.require_available(b.const_value.dtype if b.const_value is not None else b.dtype)
        return True

    @staticmethod
    def _replacement(op, a, b, y, **_):
        node = y.producer()
        out = op.op(OP, a, b, _domain=DOMAIN, _name=node.name)
        new = out.producer()
        new.doc_string = node.doc_string
        new.metadata_props.update(node.metadata_props)
        return out


def _weight_shape(value: ir.Value) -> tuple | None:
    weight = value.const_value
    if weight is None:
        producer = value.producer()
        if producer is not None and producer.op_type == "Constant" and producer.domain == "":
            weight = ir.convenience.get_const_tensor(value)
    return None if weight is None else (tuple(weight.shape), weight.dtype)


def merge_shared_inputs(model: ir.Model) -> list[str]:
    """In place, in every graph and function: each pair of one-weight ort_mtp::MatMul nodes that read
    the same A with constant weights of one K and type becomes one two-weight node (the module
    docstring), placed where the first was, named "<first>+<second>"; the outputs keep their values'
    names and consumers. Nodes are paired in graph order (a third reader of the same A stays alone).
    Returns the new nodes' names."""
    from .patterns import graphs_and_functions

    merged = []
    for container in list(graphs_and_functions(model)):
        readers: dict[ir.Value, list[ir.Node]] = {}
        for node in container:
            if (node.domain == DOMAIN and node.op_type == OP and len(node.inputs) == 2 and len(node.outputs) == 1
                    and node.inputs[0] is not None and node.inputs[1] is not None):
                readers.setdefault(node.inputs[0], []).append(node)
        for a, nodes in readers.items():
            by_weight: dict[tuple, list[ir.Node]] = {}
            for node in nodes:
                shape = _weight_shape(node.inputs[1])
                if shape is not None and len(shape[0]) == 2:
                    by_weight.setdefault((shape[0][0], shape[1]), []).append(node)
            for same in by_weight.values():
                for first, second in zip(same[0::2], same[1::2]):
                    new = ir.Node(DOMAIN, OP, [a, first.inputs[1], second.inputs[1]], num_outputs=2,
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
    # The two-weight form: a library that predates it runs none of the rewritten (and merged) nodes.
    return model(8, 8, name, node_name="probe", n2=8)


def available(library: str, provider: str = "cpu", dtype: ir.DataType = ir.DataType.FLOAT,
              device_id: int = 0) -> str | None:
    """None when `library` runs ort_mtp::MatMul on `provider` for `dtype`, else why not (one line; a
    one-node session, cached per library file)."""
    return probe.by_type(OP, library, provider, dtype, _TYPES, _probe_model, device_id)
