"""com.microsoft::GroupQueryAttention -> ort_mtp::GroupQueryAttention, whose query rows do not depend on
the forward's width (ops.group_query_attention has its semantics and reference).

The node keeps its name, its first seven inputs (query, key, value, past_key, past_value, seqlens_k,
total_sequence_length), its outputs and its attributes; nothing else in the graph changes. A node that
asks for what our op does not compute is kept as it is and reported with the reason: packed QKV (no key
input), rotary inside the op (do_rotary=1), cos/sin caches, position ids, an attention bias, head sinks,
the QK output (named as the value that blocks it), an unknown attribute (a quantized KV cache, ...), or a type the library has no kernel for
on the model's execution provider (`available`, asked once per type: a CPU-only build, or a CUDA build
run with ORT_MTP_GQA_CUDA=0, has no CUDA kernel, so CUDA models then keep ORT's node).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import RewriteRule

from . import DOMAIN, probe
from .group_query_attention import OP, GqaConfig, model
from .kinds import ATTENTION, SOURCE_DOMAIN
from .patterns import PatternMismatch, Rewrite, attribute, check, unknown_attributes

_KNOWN = {"num_heads", "kv_num_heads", "scale", "softcap", "local_window_size", "do_rotary", "rotary_interleaved",
          "smooth_softmax"}
_REQUIRED_INPUTS = 7
_OPTIONAL_INPUTS = ("cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink")
_TYPES = {ir.DataType.FLOAT: "float32", ir.DataType.FLOAT16: "float16", ir.DataType.BFLOAT16: "bfloat16"}


def unsupported_reason(node: ir.Node) -> str | None:
    """Why ort_mtp::GroupQueryAttention cannot run this node (as the graph shows it), or None."""
    extra = unknown_attributes(node, _KNOWN)
    if extra:
        return f"attribute {extra[0]!r} is not supported"
    if attribute(node, "do_rotary", 0) != 0:
        return "do_rotary=1 is not supported (rotary inside the node)"
    inputs = list(node.inputs)
    if len(inputs) < _REQUIRED_INPUTS or any(v is None for v in inputs[:_REQUIRED_INPUTS]):
        missing = "key (packed QKV)" if len(inputs) < 2 or inputs[1] is None else "past_key/past_value, seqlens_k or total_sequence_length"
        return f"{missing} is not given, which is not supported"
    for name, value in zip(_OPTIONAL_INPUTS, inputs[_REQUIRED_INPUTS:]):
        if value is not None:
            return f"input {name} is given, which is not supported"
    if inputs[0].dtype not in _TYPES:
        return f"query has type {inputs[0].dtype}, not float32, float16 or bfloat16"
    return None


class AttentionRewrite(Rewrite):
    """Every com.microsoft GroupQueryAttention our op runs becomes an ort_mtp one. available(dtype) ->
    None | reason, if given, is asked with the node's element type."""

    name = ATTENTION

    def rules(self) -> list[RewriteRule]:
        return [RewriteRule(self._pattern, self._replacement, self._check, name="GroupQueryAttentionToOrtMtp")]

    def is_candidate(self, node: ir.Node) -> bool:
        return node.op_type == OP and node.domain == SOURCE_DOMAIN

    def block_outputs(self, root, match):
        # The pattern's three outputs: a fourth (the QK output) read anywhere is named as what blocks it.
        return set(root.outputs[:3])

    @staticmethod
    def _pattern(op, query):
        return op.GroupQueryAttention(query, _domain=SOURCE_DOMAIN, _allow_other_inputs=True,
                                      _outputs=["output", "present_key", "present_value"])

    @check
    def _check(self, context, query, output, **_) -> bool:
        node = output.producer()
        self.require_selected(node)
        problem = unsupported_reason(node)
        if problem:
            raise PatternMismatch(None, problem)
        self.require_available(query.dtype)
        return True

    @staticmethod
    def _replacement(op, query, output, **_):
        node = output.producer()
        outs = op.op(OP, *node.inputs[:_REQUIRED_INPUTS], _domain=DOMAIN, _name=node.name, _outputs=3,
                     **dict(node.attributes))
        new = outs[0].producer()
        new.doc_string = node.doc_string
        new.metadata_props.update(node.metadata_props)
        return list(outs)


def _probe_model(name: str):
    return model(GqaConfig(num_heads=1, kv_num_heads=1, head_size=8, dtype=name), node_name="probe")


def available(library: str, provider: str = "cpu", dtype: ir.DataType = ir.DataType.FLOAT,
              device_id: int = 0) -> str | None:
    """None when `library` runs ort_mtp::GroupQueryAttention on `provider` for `dtype`, else why not
    (one line; a one-node session, cached per library file)."""
    return probe.by_type(OP, library, provider, dtype, _TYPES, _probe_model, device_id)
