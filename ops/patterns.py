"""The graph rewrites of `ops.rewrite`, as onnxscript rewriter rules on onnx-ir (the stack
onnxruntime-genai's builder itself writes graphs with).

Each rewrite kind is a `Rewrite`: onnxscript `RewriteRule`s (a pattern built with the rewriter's
pattern builder, a check that says in words why a match does not fit, a replacement) plus the nodes
that stand for one instance of it (`candidates`: every com.microsoft MatMulNBits node; every
com.microsoft LinearAttention node, one per linear-attention block). `apply` runs the rules over a
model's graphs and functions, node by node, through the rewriter's own `RewriteRule.try_rewrite`
(matching, checks, replacement subgraph) and `onnx_ir.convenience.replace_nodes_and_values` (the
splice), and records, through a `MatchingTracer`, why every candidate it did not replace was kept.

    rewrite = MatMulNBitsRewrite()           # or ops.linear_attention.LinearAttentionRewrite()
    outcome = apply(ir_model, rewrite, node_filter)
    outcome.rewritten, outcome.kept, outcome.filtered_out

Why not `RewriteRuleSet.apply_to_model`: it ends with onnx-ir's NameFixPass, which names every
unnamed node of the model (and renames duplicate names), and it keeps no per-candidate record; the
loop here is that method's loop (try_rewrite, replace_nodes_and_values, subgraphs, functions)
without the renaming, with the tracer kept. A replacement is spliced in only whole: a match that
fails any check leaves every node of its block as it was.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchingTracer, MatchResult, MatchStatus, RewriteRule

from . import DOMAIN, MATMUL_NBITS
from .kinds import MATMUL, SOURCE_DOMAIN

FILTERED = "not selected by the include/exclude patterns"
_SMALL_CONSTANT = 64  # constants read to check a pattern (split sizes, shapes, scales) are at most this long


class PatternMismatch(Exception):
    """Raised inside a rule's check (see `check`): why a match does not fit, naming the node."""

    def __init__(self, node: ir.Node | None, reason: str):
        self.node = node
        self.reason = f"{label(node)}: {reason}" if node is not None else reason
        super().__init__(self.reason)


def check(function):
    """Makes a check function that raises PatternMismatch return what the rewriter takes from a
    check: True, or a failed MatchResult carrying the reason and the node."""

    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except PatternMismatch as e:
            return MatchResult().fail(e.reason, e.node)

    return wrapped


# --------------------------------------------------------------------------------------------------
# onnx-ir helpers


def label(node: ir.Node) -> str:
    """A node's name, or its first output's name for an unnamed node (as ops.rewrite has always named them)."""
    return node.name or (node.outputs[0].name if node.outputs and node.outputs[0].name else f"<{node.op_type}>")


def attribute(node: ir.Node, name: str, default=None):
    """The value of attribute `name` (a Python int, float, str, list ...), or default when absent."""
    attr = node.attributes.get(name)
    if attr is None:
        return default
    if attr.is_ref():
        raise PatternMismatch(node, f"attribute {name!r} refers to a function attribute, which is not supported")
    value = attr.value
    return list(value) if isinstance(value, tuple) else value


def unknown_attributes(node: ir.Node, known: Iterable[str]) -> list[str]:
    known = set(known)
    return [name for name in node.attributes if name not in known]


def small_constant(value: ir.Value | None, what: str, node: ir.Node):
    """The numpy value of a small constant input (an initializer or a Constant node's output), read
    only when it has at most _SMALL_CONSTANT elements: a large initializer is never loaded here."""
    try:
        tensor = ir.convenience.get_const_tensor(value) if value is not None else None
    except ValueError as e:  # a Constant node with no attribute it knows (a damaged file)
        raise PatternMismatch(node, f"{what} ({value.name}) cannot be read: {e}") from None
    if tensor is None:
        raise PatternMismatch(node, f"{what} ({value.name if value is not None else 'absent'}) is not a constant")
    if tensor.size > _SMALL_CONSTANT:
        raise PatternMismatch(node, f"{what} ({value.name}) has {tensor.size} elements, not a small constant")
    try:
        return tensor.numpy()
    except (OSError, ValueError) as e:  # external data that cannot be read
        raise PatternMismatch(node, f"cannot read {what} ({value.name}): {e}") from None


def check_reshape(node: ir.Node, shape_value, tail: list[int]) -> None:
    """A Reshape of [B, S, ...] to [B, S, *tail]: the target's first two entries copy (0) or infer
    (-1, at most one of them) the batch and sequence dims."""
    target = [int(x) for x in np.ravel(small_constant(shape_value, "the target shape", node))]
    lead = target[:2]
    if len(target) != 2 + len(tail) or target[2:] != tail or any(d not in (0, -1) for d in lead) \
            or lead.count(-1) > 1:
        want = "[0, 0, " + ", ".join(map(str, tail)) + "]"
        raise PatternMismatch(node, f"target shape {target} is not {want}")


def dims(value: ir.Value | None) -> list[int | None] | None:
    """The value's shape as ints (None for a symbolic or unknown dimension), or None if its rank is unknown."""
    if value is None or value.shape is None:
        return None
    return [d if isinstance(d, int) else None for d in value.shape.dims]


def graphs_and_functions(model: ir.Model) -> Iterator[ir.Graph | ir.Function]:
    """The main graph, every subgraph in it (If/Loop/Scan bodies, depth first), every function and
    the subgraphs in functions: each container a rewrite runs on."""

    def walk(graph):
        yield graph
        for node in graph:
            for attr in node.attributes.values():
                if attr.is_ref():
                    continue
                if attr.type == ir.AttributeType.GRAPH:
                    yield from walk(attr.value)
                elif attr.type == ir.AttributeType.GRAPHS:
                    for g in attr.value:
                        yield from walk(g)

    yield from walk(model.graph)
    for function in model.functions.values():
        yield from walk(function)


# --------------------------------------------------------------------------------------------------
# The engine


@dataclasses.dataclass
class Outcome:
    """What one rewrite kind did to a model: the candidates it replaced, those it kept (with why),
    and how many the include/exclude patterns left alone."""

    rewritten: list[str] = dataclasses.field(default_factory=list)
    kept: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    filtered_out: int = 0

    @property
    def total(self) -> int:
        return len(self.rewritten) + len(self.kept) + self.filtered_out


class Rewrite:
    """One rewrite kind: rules, the candidates they replace, and the words for a kept candidate."""

    name: str = ""

    def __init__(self, available=None):
        # available(key) -> None | reason, if given: whether the library runs the replacement for that key
        # (an element type; the linear-attention rewrite's signature). Checks ask it through require_available.
        self.available = available

    def rules(self) -> list[RewriteRule]:
        raise NotImplementedError

    def is_candidate(self, node: ir.Node) -> bool:
        raise NotImplementedError

    def begin(self, selected: set[ir.Node]) -> None:
        """Called before a container is rewritten with the candidates the filter selected in it."""
        self.selected = selected

    def require_selected(self, candidate: ir.Node) -> None:
        """For checks: refuses a candidate the include/exclude patterns did not select."""
        if candidate not in self.selected:
            raise PatternMismatch(None, FILTERED)

    def require_available(self, key) -> None:
        """For checks: refuses a candidate whose replacement the library does not run (the same words for
        every candidate it applies to)."""
        if self.available is not None:
            problem = self.available(key)
            if problem:
                raise PatternMismatch(None, problem)

    def unmatched_reason(self, candidate: ir.Node) -> str:
        """Why a candidate was kept when no attempt of any rule reached it."""
        return "it does not fit the pattern"

    def block_outputs(self, root: ir.Node, match: MatchResult) -> set[ir.Value]:
        """The values a match replaces (its pattern's outputs), for a failed match too (the matcher
        records them only on success)."""
        return set(root.outputs)


class _Attempts(MatchingTracer):
    """Keeps every match attempt that got past a rule's first node (the tracer the rewriter offers
    keeps only the best one per rule)."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[tuple[ir.Node, MatchResult, MatchStatus]] = []

    def log(self, rule, container, node, match_result, status) -> None:
        if status != MatchStatus.NO_MATCH or match_result.nodes:
            self.entries.append((node, match_result, status))


def apply(model: ir.Model, rewrite: Rewrite, selects: Callable[[str], bool] | None = None) -> Outcome:
    """Runs `rewrite` over every graph and function of the model, in place. `selects(label)` is the
    include/exclude filter (None: every candidate). Returns what was replaced and what was kept."""
    outcome = Outcome()
    rules = rewrite.rules()
    for container in list(graphs_and_functions(model)):
        candidates = [n for n in container if rewrite.is_candidate(n)]
        if not candidates:
            continue
        selected = {n for n in candidates if selects is None or selects(label(n))}
        rewrite.begin(selected)
        attempts = _Attempts()
        replaced: set[ir.Node] = set()
        for node in list(container):
            if node.graph is None:
                continue  # removed by an earlier replacement
            for rule in rules:
                delta = rule.try_rewrite(model, container, node, tracer=attempts)
                if delta is None:
                    continue
                candidate = next((n for n in delta.match.nodes if n in selected), None)
                _splice(container, node, delta)
                if candidate is not None:
                    replaced.add(candidate)
                    outcome.rewritten.append(label(candidate))
                break
        for candidate in candidates:
            if candidate in replaced:
                continue
            if candidate not in selected:
                outcome.filtered_out += 1
            else:
                outcome.kept.append((label(candidate), _explain(rewrite, candidate, attempts.entries)))
    return outcome


def _splice(container, root: ir.Node, delta) -> None:
    """Puts the replacement in place of the matched nodes (the rewriter's own splice), then drops the
    Constant nodes and initializers only the removed nodes read."""
    inputs = {v for n in delta.match.nodes for v in n.inputs if v is not None}
    ir.convenience.replace_nodes_and_values(
        container, root, delta.match.nodes, delta.new_nodes, delta.match.outputs, delta.new_outputs)
    graph = container.graph if isinstance(container, ir.Function) else container
    for value in inputs:
        if value.uses() or value.is_graph_output():
            continue
        producer = value.producer()
        if producer is not None and producer.op_type == "Constant" and producer.domain == "" \
                and producer.graph is graph and not any(o.uses() or o.is_graph_output() for o in producer.outputs):
            container.remove(producer, safe=True)
        elif producer is None and isinstance(container, ir.Graph) and value.is_initializer() \
                and not value.is_graph_input() and container.initializers.get(value.name) is value:
            del container.initializers[value.name]


def _explain(rewrite: Rewrite, candidate: ir.Node, entries) -> str:
    """The reason of the attempt that got furthest towards replacing `candidate`."""
    consumers = {user for out in candidate.outputs for user, _ in out.uses()}
    related = [(root, match, status) for root, match, status in entries
               if root is candidate or candidate in match.nodes or root in consumers]
    if not related:
        return rewrite.unmatched_reason(candidate)
    root, match, status = max(related, key=lambda e: (e[0] is candidate or candidate in e[1].nodes,
                                                      int(e[2]), len(e[1].nodes)))
    reason = match.reason or "it does not fit the pattern"
    if "other uses preventing replacement" in reason:
        return _outside_use(match, rewrite.block_outputs(root, match)) or reason
    if status == MatchStatus.NO_MATCH:
        where = next((f for f in match.failure_nodes_and_values if isinstance(f, ir.Node)), None)
        if where is not None and label(where) not in reason:
            reason = f"{label(where)}: {reason}"
        reason = f"does not fit the pattern ({reason.rstrip('.')})"
    return reason


def _outside_use(match: MatchResult, outputs: set[ir.Value]) -> str | None:
    """For a match refused because a value inside the block is used outside it: which value, where."""
    nodes = set(match.nodes)
    for node in match.nodes:
        for value in node.outputs:
            if value in outputs:
                continue
            if value.is_graph_output():
                return f"{value.name} (an output of {label(node)}, inside the block) is a graph output"
            for user, _ in value.uses():
                if user not in nodes:
                    return (f"{value.name} (an output of {label(node)}, inside the block) is also read by "
                            f"{label(user)}, outside the block")
    return None


# --------------------------------------------------------------------------------------------------
# com.microsoft::MatMulNBits -> ort_mtp::MatMulNBits

_KNOWN_ATTRIBUTES = {"K", "N", "bits", "block_size", "accuracy_level"}
_SUPPORTED_A_TYPES = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16}
_G_IDX = 4
_SCALES = 2


def matmul_unsupported_reason(node: ir.Node) -> str | None:
    """Why ort_mtp::MatMulNBits cannot run this node, or None. Mirrors the op's own checks
    (csrc/matmul_nbits/matmul_nbits.cc) for what can be seen in the graph."""
    for name, attr in node.attributes.items():
        if name == "weight_prepacked" and not attr.is_ref() and attr.value == 0:
            continue  # explicit "raw layout", which is ours
        if name not in _KNOWN_ATTRIBUTES:
            return f"attribute {name!r} is not supported"
    for name in ("K", "N", "block_size"):
        if name not in node.attributes:
            return f"attribute {name!r} is missing"
    bits = attribute(node, "bits", 4)
    if bits not in (4, 8):
        return f"bits={bits} is not supported (4 or 8)"
    block = attribute(node, "block_size")
    if block < 16 or block > 256 or block & (block - 1):
        return f"block_size={block} is not a power of two in [16, 256]"
    if len(node.inputs) > _G_IDX and node.inputs[_G_IDX] is not None:
        return "g_idx (act-order) is not supported"
    if len(node.inputs) > _SCALES and node.inputs[_SCALES] is not None:
        scales = node.inputs[_SCALES]
        if scales.is_initializer() and scales.dtype is not None and scales.dtype not in _SUPPORTED_A_TYPES:
            return f"scales type {scales.dtype.name} is not supported"
    return None


class MatMulNBitsRewrite(Rewrite):
    """Every com.microsoft MatMulNBits our op runs becomes an ort_mtp MatMulNBits: same name, inputs,
    attributes and output; the initializers are not touched."""

    name = MATMUL

    def rules(self) -> list[RewriteRule]:
        return [RewriteRule(self._pattern, self._replacement, self._check, name="MatMulNBitsToOrtMtp")]

    def is_candidate(self, node: ir.Node) -> bool:
        return node.op_type == MATMUL_NBITS and node.domain == SOURCE_DOMAIN

    @staticmethod
    def _pattern(op, a):
        return op.MatMulNBits(a, _domain=SOURCE_DOMAIN, _allow_other_inputs=True, _outputs=["y"])

    @check
    def _check(self, context, a, y, **_) -> bool:
        node = context.root
        self.require_selected(node)
        problem = matmul_unsupported_reason(node)
        if problem:
            raise PatternMismatch(None, problem)
        return True

    @staticmethod
    def _replacement(op, a, y, **_):
        node = y.producer()
        out = op.op(MATMUL_NBITS, *node.inputs, _domain=DOMAIN, _name=node.name, **dict(node.attributes))
        new = out.producer()
        new.doc_string = node.doc_string
        new.metadata_props.update(node.metadata_props)
        return out
