"""com.microsoft::SkipSimplifiedLayerNormalization -> ort_mtp::SkipSimplifiedLayerNormalization
(csrc/norm/skip_norm.h has its arithmetic), on CUDA, where the library runs it.

The builder puts one before each attention or linear-attention block and one before each MLP (the
residual add and RMSNorm: two per layer; the first layer's first is a SimplifiedLayerNormalization,
there being no residual yet, and stays ORT's), and one before the lm_head. ORT's kernel already computes
each row alone; ours does too, in one fixed order, and on CUDA (sm_90) it is launched with programmatic
dependent launch: the matmul kernels after it start copying their weights while it runs instead of
after it ends. ORT's kernel is an ordinary launch, so each one stopped that overlap between our
launches (docs/kernels.md#launch-and-pdl); removing such breaks is what made the CUDA MLP fusion worth
0.74 ms of a 27B-class greedy token against the ~0.25 ms its two elementwise kernels ran
(bench/results/2026-12-05-mlp-cuda).

The rewrite is a change of domain: the node keeps its name, inputs, outputs and attributes. A node is
kept as it was, and reported with the reason, when it names the outputs mean or inv_std_var (ours does
not compute them), has no epsilon attribute (ORT's default is its schema's; ours wants it written
out), or another attribute, a hidden size above the CUDA kernel's limit (kSkipNormCudaMaxHidden), an
element type other than float32 / float16 / bfloat16, or the library does not run the op on the
model's execution provider (`available`; on the CPU EP ORT's kernel stays: `available` says why). The
CUDA kernel is registered only when the library is loaded with ORT_MTP_SKIP_NORM_CUDA=1 (csrc/norm/
skip_norm.cc): measured on a GPU it made the 27B-class model slower (bench/results/2026-12-05-skip-norm-cuda),
so by default CUDA models keep ORT's node too.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from . import DOMAIN, probe
from .patterns import Outcome, graphs_and_functions, label

OP = "SkipSimplifiedLayerNormalization"
SOURCE_DOMAIN = "com.microsoft"
MAX_HIDDEN = 12280  # kSkipNormCudaMaxHidden (csrc/norm/skip_norm.h): a row's sums and 8 more in 48 KB of shared memory
_ATTRIBUTES = {"epsilon"}
_TYPES = {ir.DataType.FLOAT: "float32", ir.DataType.FLOAT16: "float16", ir.DataType.BFLOAT16: "bfloat16"}


def reference(x, skip, gamma, epsilon: float, bias=None) -> tuple[np.ndarray, np.ndarray]:
    """float64 (output, input_skip_bias_sum) of x, skip [..., H], gamma (and bias) [H]."""
    s = np.asarray(x, np.float64) + np.asarray(skip, np.float64)
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    rms = np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + epsilon)
    return s / rms * np.asarray(gamma, np.float64), s


def model(hidden: int, dtype: str = "float32", domain: str = DOMAIN, node_name: str = "/model/layers.1/input_layernorm",
          epsilon: float | None = 1e-6, gamma: np.ndarray | None = None, bias: np.ndarray | None = None,
          outputs=("output", "", "", "input_skip_bias_sum"), float32_io: bool = False):
    """A one-node model: input and skip [batch, seq, hidden] -> the node's `outputs` (names; "" leaves
    one out), gamma (and bias) initializers (gamma default: 1 + j / hidden). float32_io: graph values in
    float32, cast to and from `dtype` around the node (numpy has no bfloat16)."""
    from onnx import TensorProto, helper, numpy_helper

    def elem(name):
        return TensorProto.BFLOAT16 if name == "bfloat16" else helper.np_dtype_to_tensor_dtype(np.dtype(name))

    t = elem(dtype)
    io = TensorProto.FLOAT if float32_io else t
    shape = ["batch", "seq", hidden]
    inputs = [helper.make_tensor_value_info(n, io, shape) for n in ("input", "skip")]
    graph_outputs = [helper.make_tensor_value_info(n, io, shape) for n in outputs if n]

    def weight(name, value):
        value = np.asarray(value, np.float32)
        if dtype == "bfloat16":
            bits = (value.view(np.uint32) >> 16).astype(np.uint16)
            return helper.make_tensor(name, TensorProto.BFLOAT16, bits.shape, bits.tobytes(), raw=True)
        return numpy_helper.from_array(value.astype(dtype), name)

    gamma = 1.0 + np.arange(hidden) / hidden if gamma is None else gamma
    initializers = [weight("gamma", gamma)] + ([weight("bias", bias)] if bias is not None else [])
    nodes = []
    names = ["input", "skip"]
    if float32_io:
        nodes += [helper.make_node("Cast", [n], [n + "_t"], to=t) for n in names]
        names = [n + "_t" for n in names]
    node_outputs = [(n + "_t" if float32_io and n else n) for n in outputs]
    attrs = {} if epsilon is None else {"epsilon": float(epsilon)}
    nodes.append(helper.make_node(OP, names + ["gamma"] + (["bias"] if bias is not None else []), node_outputs,
                                  name=node_name, domain=domain, **attrs))
    if float32_io:
        nodes += [helper.make_node("Cast", [n + "_t"], [n], to=TensorProto.FLOAT) for n in outputs if n]
    graph = helper.make_graph(nodes, "skip_norm", inputs, graph_outputs, initializer=initializers)
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                   helper.make_opsetid(domain, 1)])


def is_candidate(node: ir.Node) -> bool:
    return node.op_type == OP and node.domain == SOURCE_DOMAIN


def unsupported_reason(node: ir.Node) -> str | None:
    """Why ours should not run this node (as the graph shows it), or None."""
    extra = sorted(set(node.attributes) - _ATTRIBUTES)
    if extra:
        return f"it has attribute {extra[0]!r}"
    if "epsilon" not in node.attributes:
        return "it has no epsilon attribute (ORT's schema default is left implicit; ours needs it written out)"
    if not 3 <= len(node.inputs) <= 4 or any(v is None for v in node.inputs[:3]):
        return "it does not have inputs input, skip and gamma (and at most bias)"
    for index, name in ((1, "mean"), (2, "inv_std_var")):
        if len(node.outputs) > index and node.outputs[index].name:
            return f"it names output {name} ({node.outputs[index].name}), which ours does not compute"
    gamma = node.inputs[2]
    if gamma.shape is not None and len(gamma.shape) == 1 and isinstance(gamma.shape[0], int) \
            and gamma.shape[0] > MAX_HIDDEN:
        return f"its hidden size {gamma.shape[0]} is above the CUDA kernel's {MAX_HIDDEN}"
    dtype = _dtype(node)
    if dtype is not None and dtype not in _TYPES:
        return f"its input is {dtype}, not float32, float16 or bfloat16"
    return None


def _dtype(node: ir.Node):
    """The node's element type: its input's, or gamma's (an initializer) where the graph does not say."""
    gamma = node.inputs[2]
    return node.inputs[0].dtype or (gamma.const_value.dtype if gamma.const_value is not None else gamma.dtype)


def rewrite(model: ir.Model, available=None, selects=None) -> Outcome:
    """In place, in every graph and function: each candidate node ours runs changes domain (the module
    docstring). available(dtype) -> None | reason, if given, is asked with the input's element type;
    selects(label) is the include/exclude filter (None: every candidate)."""
    outcome = Outcome()
    for container in graphs_and_functions(model):
        for node in container:
            if not is_candidate(node):
                continue
            name = label(node)
            if selects is not None and not selects(name):
                outcome.filtered_out += 1
                continue
            why = unsupported_reason(node)
            if why is None and available is not None:
                why = available(_dtype(node))
            if why:
                outcome.kept.append((name, why))
                continue
            node.domain = DOMAIN
            outcome.rewritten.append(name)
    if outcome.rewritten:
        model.opset_imports.setdefault(DOMAIN, 1)
    return outcome


def _probe_model(name: str):
    return model(16, name, node_name="probe", float32_io=name == "bfloat16")


def available(library: str, provider: str = "cpu", dtype: ir.DataType = ir.DataType.FLOAT,
              device_id: int = 0) -> str | None:
    """None when `library` runs ort_mtp::SkipSimplifiedLayerNormalization on `provider` for `dtype` and the
    rewrite is worth it there, else why not (one line; a one-node session, cached per library file).
    On the CPU EP ORT's kernel stays: ours computes the same rows there but is plain scalar code, and its
    point, the launch, is CUDA's."""
    if provider == "cpu":
        return "on the CPU EP ONNX Runtime's kernel is kept (ours is for CUDA's programmatic dependent launch)"
    return probe.by_type(OP, library, provider, dtype, _TYPES, _probe_model, device_id)
