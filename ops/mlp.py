"""A gated MLP's gate and up projections and its SiLU onto one ort_mtp::MatMulNBits node
(activation="swiglu", csrc/matmul_nbits/matmul_nbits.cc), where the library runs that form (the CPU and
CUDA EPs).

The builder writes a Qwen3.5 MLP as (models/graph.py and onnxruntime-genai's builders/base.py)

    gate = MatMulNBits(x, gate weights)     up = MatMulNBits(x, up weights)
    h = Mul(gate, Sigmoid(gate))            y = Mul(h, up)            -> down_proj

and after the matmul rewrite both projections are ort_mtp::MatMulNBits nodes. These five nodes become
one MatMulNBits reading the gate's weights as its first set and the up's as its second (N2 = N), whose
output y is silu(gate) * up with gate and up the bits the two projections computed. On a CPU that is
four fewer nodes per layer (each costs ONNX Runtime a dispatch), one int8 quantisation of x instead of
two, and one thread-pool job for both projections (then one for the activation); on CUDA, two matmul
launches and no elementwise kernel (ORT runs the Sigmoid and Mul as a QuickGelu kernel and a Mul
kernel: two launches per layer, ~0.25 ms of a 27B-class token on an H200). Rows still do not depend on
the width (each output is a function of its own row's projections). The activation is the op's own
definition (g / (1 + exp(-g)) * u in float32 with its own exp: csrc/matmul_nbits/silu_mul.h, the same
bits on both EPs for the same g and u), not ONNX Runtime's Sigmoid and Mul kernels, so the output may
differ from the unfused graph's by float32 rounding. On CUDA the driver's tiles cache packs both of the
fused node's weight sets (ops.packing.weight_sets).

A match is kept as it was, and reported with the reason, when the projections differ in anything
but their weights (K, N, bits, block size, accuracy level), take the tiles layout or g_idx, only one
has zero points, a value inside the block is read outside it, or the library does not run the fused
form on the model's execution provider (`available`: a one-node probe session). Candidates are the Sigmoid nodes reading an ort_mtp::MatMulNBits output; the fused
node is named after the two projections ("<gate>+<up>").
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import RewriteRule

from . import DOMAIN, MATMUL_NBITS, nbits, probe
from .kinds import MLP
from .patterns import PatternMismatch, Rewrite, attribute, check, label

ACTIVATION = "swiglu"
_SHARED = ("K", "N", "bits", "block_size", "accuracy_level")
_KNOWN = set(_SHARED) | {"packing"}
_ZERO_POINTS, _G_IDX, _BIAS = 3, 4, 5
_TYPES = {ir.DataType.FLOAT: "float32", ir.DataType.FLOAT16: "float16", ir.DataType.BFLOAT16: "bfloat16"}


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if len(node.inputs) > index else None


def unsupported_reason(gate: ir.Node, up: ir.Node) -> str | None:
    """Why the two projections cannot be one swiglu node (as the graph shows them), or None."""
    for node in (gate, up):
        extra = [name for name in node.attributes if name not in _KNOWN]
        if extra:
            return f"{label(node)} has attribute {extra[0]!r}"
        if attribute(node, "packing", 0) != 0:
            return f"{label(node)} takes the tiles layout (packing=1)"
        if _input(node, _G_IDX) is not None:
            return f"{label(node)} has a g_idx input"
    for name in _SHARED:
        if attribute(gate, name) != attribute(up, name):
            return (f"the projections differ in {name} ({label(gate)}: {attribute(gate, name)}, "
                    f"{label(up)}: {attribute(up, name)})")
    if (_input(gate, _ZERO_POINTS) is None) != (_input(up, _ZERO_POINTS) is None):
        return "only one of the projections has zero points"
    return None


class MlpRewrite(Rewrite):
    """gate/up MatMulNBits + Sigmoid + Mul + Mul -> one swiglu MatMulNBits (module docstring).
    available(dtype) -> None | reason, if given, is asked with the input's element type."""

    name = MLP

    def rules(self) -> list[RewriteRule]:
        # Mul is commutative: the rule's commuted forms match Mul(s, g) and Mul(up, h) too.
        return RewriteRule(self._pattern, self._replacement, self._check, name="GatedMlpToSwiGlu").commute()

    def is_candidate(self, node: ir.Node) -> bool:
        if node.op_type != "Sigmoid" or node.domain not in ("", "ai.onnx") or not node.inputs:
            return False
        producer = node.inputs[0].producer() if node.inputs[0] is not None else None
        return producer is not None and producer.op_type == MATMUL_NBITS and producer.domain == DOMAIN

    def unmatched_reason(self, candidate: ir.Node) -> str:
        return "it is not a gated MLP's SiLU (Sigmoid and Mul of one projection, times another of the same input)"

    @staticmethod
    def _pattern(op, x):
        gate = op.MatMulNBits(x, _domain=DOMAIN, _allow_other_inputs=True, _outputs=["gate"])
        up = op.MatMulNBits(x, _domain=DOMAIN, _allow_other_inputs=True, _outputs=["up"])
        return op.Mul(op.Mul(gate, op.Sigmoid(gate)), up)

    @check
    def _check(self, context, x, gate, up, **_) -> bool:
        sigmoid = next(user for user, _ in gate.uses() if user.op_type == "Sigmoid")
        self.require_selected(sigmoid)
        problem = unsupported_reason(gate.producer(), up.producer())
        if problem:
            raise PatternMismatch(None, problem)
        self.require_available(x.dtype)
        return True

    @staticmethod
    def _replacement(op, x, gate, up, **_):
        g, u = gate.producer(), up.producer()

        def weight_set(node, g_idx: bool) -> list:
            inputs = list(node.inputs) + [None] * (6 - len(node.inputs))
            return inputs[1:4] + ([None] if g_idx else []) + [inputs[_BIAS]]

        inputs = [x] + weight_set(g, True) + weight_set(u, False)
        while inputs[-1] is None:
            inputs.pop()
        attributes = {name: attribute(g, name) for name in _SHARED if name in g.attributes}
        out = op.op(MATMUL_NBITS, *inputs, _domain=DOMAIN, _name=f"{g.name}+{u.name}",
                    N2=attribute(u, "N"), activation=ACTIVATION, **attributes)
        new = out.producer()
        new.doc_string = g.doc_string
        new.metadata_props.update(g.metadata_props)
        return out


def _probe_model(name: str):
    rng = np.random.default_rng(0)
    gate, up = (nbits.random_weights(rng, 32, 8, dtype=name) for _ in range(2))
    return nbits.single_node_model(gate, domain=DOMAIN, node_name="probe", second=up, activation=ACTIVATION,
                                   accuracy_level=4)


def available(library: str, provider: str = "cpu", dtype: ir.DataType = ir.DataType.FLOAT,
              device_id: int = 0) -> str | None:
    """None when `library` runs ort_mtp::MatMulNBits' swiglu form on `provider` for `dtype`, else why not
    (one line; a one-node session, cached per library file)."""
    return probe.by_type(f"{MATMUL_NBITS} (activation={ACTIVATION})", library, provider, dtype, _TYPES, _probe_model,
                         device_id)
